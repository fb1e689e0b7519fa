"""`python -m qlower demo`: a Llama-style decoder block, quantized, compiled with and without qlower.

Shows in under two minutes on a 2-core CPU what qlower does to a real model's linears: the report of every
decision, the error against the eager quantized model (and a float64 reference), and the speed against stock
`torch.compile` and the unquantized bf16 model. No RoPE and no KV cache: the point is the seven linears.
Then one small MX (fp8 e4m3 elements, e8m0 scales per 32) weight-only linear goes through qlower on the same
device: its report row and its error against eager (`run_mx`). Times are medians with their spread over the
repeats (qlower.timing), and a WARNING line says when a spread is wide or the machine was loaded.
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.patterns import mx_format
from qlower.quantize import QUANTIZERS
from qlower.timing import SPREAD_DEFINITION, Timing, machine_load, stability_warning, summarize


@dataclass(frozen=True)
class BlockConfig:
    hidden: int = 1024
    intermediate: int = 2816  # K of down_proj: a multiple of 16 (the bf16 packed CPU kernel needs it)
    head_dim: int = 64
    eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.heads = cfg.hidden // cfg.head_dim
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderBlock(nn.Module):
    """Pre-norm Llama block: x + attn(norm(x)), then + SwiGLU MLP(norm(.))."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = Attention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.input_norm(x))
        return h + self.mlp(self.post_attn_norm(h))


def build_block(
    cfg: BlockConfig, device: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> nn.Module:
    """Random-weight block in inference mode (no grads, so Inductor compiles an inference graph)."""
    torch.manual_seed(seed)
    block = DecoderBlock(cfg).to(device=device, dtype=dtype).eval()
    block.requires_grad_(False)
    return block


def quantize(block: nn.Module, family: str) -> tuple[nn.Module, int]:
    """A quantized copy of `block` and how many linears the family's quantizer replaced."""
    if family not in QUANTIZERS:
        raise SystemExit(f"qlower demo: no demo quantizer for family {family!r} (have: {sorted(QUANTIZERS)})")
    qblock = copy.deepcopy(block)
    return qblock, QUANTIZERS[family](qblock)


def compile_stock(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return torch.compile(model, dynamic=False)


def compile_qlower(model: nn.Module, family: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return torch.compile(model, dynamic=False, options=qlower.inductor_options(families=(family,)))


def time_runs(fn: Callable[[], object], device: str, budget_s: float, max_runs: int = 30) -> list[float]:
    """Seconds of `fn()` after a warm-up call: at least 2 runs, then until `max_runs` or `budget_s`."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 2 or (len(times) < max_runs and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def median_times(
    fns: dict[str, Callable[[], object]], device: str, budget_s: float, rounds: int = 3
) -> dict[str, Timing]:
    """Median seconds and spread of each fn over all its runs, timed in interleaved rounds so a changing
    machine load hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += time_runs(fn, device, budget_s / rounds)
    return {name: summarize(ts) for name, ts in samples.items()}


@dataclass
class Setup:
    """The models being compared: unquantized, quantized (eager, float64, stock compile, qlower compile)."""

    block: nn.Module
    qblock: nn.Module
    qblock64: nn.Module
    stock: Callable[[torch.Tensor], torch.Tensor]
    qlowered: Callable[[torch.Tensor], torch.Tensor]
    expected_linears: int
    device: str


def setup(family: str, device: str, cfg: BlockConfig) -> Setup:
    block = build_block(cfg, device)
    qblock, expected = quantize(block, family)
    qblock64 = copy.deepcopy(qblock).to(torch.float64)
    return Setup(
        block, qblock, qblock64, compile_stock(qblock), compile_qlower(qblock, family), expected, device
    )


@dataclass
class ShapeResult:
    """Everything measured for one input size."""

    m: int
    report: qlower.Report
    expected_linears: int
    err_vs_eager: float  # max |qlower - eager quantized|
    err_qlower_vs_f64: float  # max |qlower - float64 reference of the quantized model|
    err_eager_vs_f64: float  # the same for eager bf16 (the tolerance bf16 itself achieves)
    ref_max: float  # max |float64 reference|, the scale of the errors above
    times: dict[str, Timing] = field(default_factory=dict)  # eager_bf16, eager_quant, stock, qlower
    load: tuple[float, int] | None = None  # (load average, CPUs) right after the timing

    @property
    def all_lowered(self) -> bool:
        return len(self.report.lowered) == self.expected_linears == len(self.report)


def run_shape(s: Setup, m: int, *, timed: bool = True, budget_s: float = 1.0) -> ShapeResult:
    """Compile (on first call) and compare at sequence length `m`, batch 1."""
    x = torch.randn(1, m, s.block.input_norm.weight.shape[0], device=s.device, dtype=torch.bfloat16)
    with torch.no_grad():
        y_ql = s.qlowered(x)
        report = qlower.last_report()
        y_eager = s.qblock(x)
        y_ref = s.qblock64(x.to(torch.float64))
        res = ShapeResult(
            m=m,
            report=report,
            expected_linears=s.expected_linears,
            err_vs_eager=(y_ql.float() - y_eager.float()).abs().max().item(),
            err_qlower_vs_f64=(y_ql.double() - y_ref).abs().max().item(),
            err_eager_vs_f64=(y_eager.double() - y_ref).abs().max().item(),
            ref_max=y_ref.abs().max().item(),
        )
        if timed:
            models = {"eager_bf16": s.block, "eager_quant": s.qblock, "stock": s.stock, "qlower": s.qlowered}
            res.times = median_times({k: (lambda f=f: f(x)) for k, f in models.items()}, s.device, budget_s)
            res.load = machine_load()
    return res


def run(
    family: str = "woq_int8",
    device: str = "cpu",
    sizes: tuple[int, ...] = (1, 128),
    cfg: BlockConfig | None = None,
    *,
    timed: bool = True,
    budget_s: float = 1.0,
    log: Callable[[str], None] = print,
) -> list[ShapeResult]:
    """Build, quantize, compile both ways and measure each size in `sizes`."""
    s = setup(family, device, cfg or BlockConfig())
    results = []
    # A compile-cache hit skips Inductor's passes, qlower's included, and would leave nothing to report.
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        for m in sizes:
            log(f"M={m}: compiling (stock and qlower){' and timing' if timed else ''} ...")
            results.append(run_shape(s, m, timed=timed, budget_s=budget_s))
    return results


class MXWeightOnlyLinear(nn.Module):
    """y = x @ dequant(q, e).T with MX weights: `elem` elements and one e8m0 scale code per 32 along K, the
    dequantization written in plain torch ops (`mx_format.dequantize`), as a user's model spells it."""

    def __init__(self, k: int, n: int, device: str, elem: str = "e4m3", seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator(device="cpu").manual_seed(seed)
        q, e = mx_format.quantize(torch.randn(n, k, generator=g) * k**-0.5, elem)
        self.register_buffer("q", q.to(device))
        self.register_buffer("e", e.to(device))
        self.elem = elem

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, mx_format.dequantize(self.q, self.e, self.elem, x.dtype))


@dataclass
class MXResult:
    report: qlower.Report
    err_vs_eager: float  # max |qlower - eager|
    ref_max: float  # max |eager|, the scale of the error

    @property
    def lowered(self) -> bool:
        return len(self.report) == 1 and len(self.report.lowered) == 1


MX_SHAPE = (4, 256, 256)  # (M, K, N) of the demo's MX linear: a few seconds of compile on a 2-core CPU


def run_mx(device: str, m: int = MX_SHAPE[0], k: int = MX_SHAPE[1], n: int = MX_SHAPE[2]) -> MXResult:
    """One MX weight-only linear [M, K] x [N, K] (as child `proj` of the compiled module, so its report row
    names it) compiled with qlower's `mx` family on `device`."""
    model = nn.Sequential(collections.OrderedDict(proj=MXWeightOnlyLinear(k, n, device))).eval()
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    fn = torch.compile(model, dynamic=False, options=qlower.inductor_options(families=("mx",)))
    with (
        torch.no_grad(),
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        y = fn(x)
        report = qlower.last_report()
        y_eager = model(x)
    return MXResult(
        report, (y.float() - y_eager.float()).abs().max().item(), y_eager.float().abs().max().item()
    )


def check_device(device: str) -> str:
    """`device` if this torch can run on it; otherwise qlower.UnsupportedPlatformError (ValueError for a
    string that names no device), which `python -m qlower` prints as one line."""
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"--device {device!r} names no torch device ({str(e).splitlines()[0]})") from None
    module = getattr(torch, kind, None)
    if kind != "cpu" and not (
        module is not None and hasattr(module, "is_available") and module.is_available()
    ):
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise qlower.UnsupportedPlatformError(
            f"--device {device}: this torch ({torch.__version__}, {build}) sees no {kind} device; "
            "run with --device cpu, or install a torch built for it"
        )
    return device


_COLUMNS = {
    "eager_bf16": "eager bf16",
    "eager_quant": "eager quant",
    "stock": "stock compile",
    "qlower": "qlower",
}


def _cell(t: Timing) -> str:
    return f"{t.median * 1e3:.3f}ms {t.spread_text()}"


def format_results(results: list[ShapeResult]) -> str:
    """The time table: each time is the median and its spread (`1.234ms ±3%`), then qlower's ratios."""
    w = 16
    head = "  ".join([f"{'M':>5}", *(f"{c:>{w}}" for c in _COLUMNS.values())])
    head += f"  {'vs stock':>8}  {'vs bf16':>7}  {'max err vs eager':>16}"
    lines = [head, "-" * len(head)]
    for r in results:
        t = r.times
        if not t:
            lines.append(f"{r.m:>5}  {'(not timed)':>{w}}{'':>{len(head) - w - 23}}{r.err_vs_eager:>16.3g}")
            continue
        med = {k: v.median for k, v in t.items()}
        cells = [f"{r.m:>5}", *(f"{_cell(t[k]):>{w}}" for k in _COLUMNS)]
        cells += [f"{med['stock'] / med['qlower']:>7.2f}x", f"{med['eager_bf16'] / med['qlower']:>6.2f}x"]
        lines.append("  ".join(cells) + f"  {r.err_vs_eager:>16.3g}")
    return "\n".join(lines)


def timing_warning(results: list[ShapeResult]) -> str | None:
    """The demo's WARNING line (qlower.timing.stability_warning) over every time of every size."""
    spreads = {f"{name} M={r.m}": t.spread for r in results for name, t in r.times.items()}
    loads = [r.load for r in results if r.load is not None]
    return stability_warning(spreads, max(loads) if loads else None)


def main(
    family: str,
    device: str | None,
    sizes: tuple[int, ...],
    hidden: int,
    intermediate: int,
    threads: int | None = None,
    *,
    mx: bool = True,
) -> int:
    """The CLI body: prints reports and the comparison, then (`mx`) the MX linear's report; returns 1 if any
    linear was left unlowered."""
    device = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if threads:
        torch.set_num_threads(threads)
    cfg = BlockConfig(hidden=hidden, intermediate=intermediate)
    print(
        f"qlower demo: Llama-style block, hidden={cfg.hidden}, intermediate={cfg.intermediate}, bf16, "
        f"family={family}, device={device}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
    )
    start = time.perf_counter()
    results = run(family, device, sizes, cfg)
    ok = True
    for r in results:
        print(f"\n--- M={r.m} ---\n{r.report.table()}")
        if not r.all_lowered:
            ok = False
            print(
                f"ERROR: {len(r.report.lowered)} of {r.expected_linears} quantized linears lowered "
                f"({len(r.report)} candidates found)"
            )
        print(
            f"max abs error: qlower vs eager quantized {r.err_vs_eager:.3g}; vs float64 reference: "
            f"qlower {r.err_qlower_vs_f64:.3g}, eager bf16 {r.err_eager_vs_f64:.3g}"
        )
    print(
        f"\nmedian time per forward ({SPREAD_DEFINITION}; vs stock = stock compile / qlower; "
        "vs bf16 = eager unquantized / qlower)"
    )
    print(format_results(results))
    warning = timing_warning(results)
    if warning:
        print(warning)
    if mx:
        r_mx = run_mx(device)
        print(
            f"\n--- MX weight-only linear (e4m3 elements, e8m0 scales), M, K, N = {', '.join(map(str, MX_SHAPE))} ---"
        )
        print(r_mx.report.table())
        print(f"max abs error: qlower vs eager {r_mx.err_vs_eager:.3g} (max |y| {r_mx.ref_max:.3g})")
        if not r_mx.lowered:
            ok = False
            print("ERROR: the MX linear was not lowered")
    print(
        f"\ndone in {time.perf_counter() - start:.0f} s: {'every linear lowered' if ok else 'NOT every linear lowered'}"
    )
    return 0 if ok else 1
