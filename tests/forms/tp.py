"""Tensor parallel at TP=2 for tests/integrations/tp/test_tensor_parallel.py: a Llama-style block, sharded the
two ways users shard it, and the worker each rank runs.

gpt-fast's `tp.py` flow: each rank holds its shard of hand-written quantized linears (column-parallel wq, wk,
wv, w1, w3 split along N with their per-channel scales sliced; row-parallel wo, w2 split along K with the full
per-channel scale) and all-reduces the attention and FFN outputs with `_functional_collectives.all_reduce`.
torchtitan's flow: `parallelize_module` with Colwise/RowwiseParallel on an nn.Linear block, then torchao's
`quantize_`. Each rank compiles its block with `qlower.inductor_options()` and hands back its report rows and
its error against the unsharded quantized block computed in float64.
"""

from __future__ import annotations

import copy
import datetime
import os
import pickle
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from qlower.patterns import mx_format as fmt
from qlower.quantize import quantize_per_row_int8
from tests.forms.dynamic_int8 import per_token
from tests.helpers import SUBPROCESS_TIMEOUT_S

WORLD = 2
DIM, HEADS = 256, 4
# The FFN's shards at TP=2: N = 344 (w1, w3) and K = 344 (w2), multiples of neither 16 nor 32 (the bf16 packed
# int8 kernel needs K % 16 == 0: lowerings/devices/cpu.py, so w2's shard takes another lowering).
HIDDEN = 688
# MX splits K on its 32-element blocks: 704 -> K = 352 per shard (11 blocks, a multiple of neither 64 nor 128).
MX_HIDDEN = 704
BATCH, SEQ = 2, 3  # M = 6 <= PACKED_MAX_M[bf16]: the woq shards with K % 16 == 0 take the packed kernel
COLWISE = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
ROWWISE = ("attention.wo", "feed_forward.w2")
LINEARS = COLWISE + ROWWISE
ROWWISE_SHORT = ("wo", "w2")


def short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


# ----------------------------------------------------------------------------------------------- the block
class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x if x.dtype == torch.float64 else x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
        return (y * self.weight.to(y.dtype)).to(x.dtype)


class Attention(nn.Module):
    """Projections + causal SDPA; the local head count follows from wq's output (`view(..., -1, head_dim)`)."""

    def __init__(self, linears: dict[str, nn.Module], head_dim: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (linears[n] for n in ("wq", "wk", "wv", "wo"))
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, linears: dict[str, nn.Module]) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = (linears[n] for n in ("w1", "w3", "w2"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """gpt-fast's TransformerBlock without RoPE: h = x + attention(norm(x)); h + feed_forward(norm(h))."""

    def __init__(self, linears: dict[str, nn.Module], seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)  # the norms' weights: the same on every rank
        self.attention = Attention(linears, DIM // HEADS)
        self.feed_forward = FeedForward(linears)
        self.attention_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def float_weights(hidden: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsharded float weights [N, K] of one block (std K^-1/2: each branch's output is O(1))."""
    g = torch.Generator().manual_seed(seed)
    shapes = {n: (DIM, DIM) for n in ("wq", "wk", "wv", "wo")} | {"w1": (hidden, DIM), "w3": (hidden, DIM)}
    shapes["w2"] = (DIM, hidden)
    return {n: torch.randn(*s, generator=g) * s[1] ** -0.5 for n, s in shapes.items()}


def block_input(dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, DIM, generator=torch.Generator().manual_seed(1)).to(dtype)


# ------------------------------------------------------------------------- hand-written quantized linears
class WoqInt8(nn.Module):
    """gpt-fast's WeightOnlyInt8Linear: `F.linear(x, w_int8.to(x.dtype)) * scales`, w [N, K], scales [N]."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype)) * self.scales


class DynInt8(nn.Module):
    """tests/forms/dynamic_int8.py's IntMMDivide: per-token symmetric int8 activations, `torch._int_mm`, the
    rescale in fp32. w int8 [N, K], scales fp32 [N]."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        y = torch._int_mm(xq, self.weight.t()) * sx * self.scales
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)


class MXWeightOnly(nn.Module):
    """Weight-only MX: elements (fp8, or e2m1 packed two per byte) and uint8 e8m0 codes per 32 along K,
    dequantized by hand (`mx_format.dequantize`, as tests/forms/mx.py's MXLinear), then F.linear."""

    def __init__(self, q: torch.Tensor, e: torch.Tensor, elem: str) -> None:
        super().__init__()
        self.register_buffer("q", q)
        self.register_buffer("e", e)
        self.elem = elem

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, fmt.dequantize(self.q, self.e, self.elem, x.dtype))


def _shard(t: torch.Tensor, dim: int, rank: int) -> torch.Tensor:
    assert t.shape[dim] % WORLD == 0, (t.shape, dim)
    return torch.tensor_split(t, WORLD, dim=dim)[rank].contiguous()


def _int8_shard(m: nn.Module, colwise: bool, rank: int) -> nn.Module:
    """gpt-fast `_apply_tp_linear`: colwise splits the weight along N and slices the scales; rowwise splits it
    along K and keeps the full per-channel scale."""
    if colwise:
        return type(m)(_shard(m.weight, 0, rank), _shard(m.scales, 0, rank))
    return type(m)(_shard(m.weight, 1, rank), m.scales.clone())


def _mx_shard(m: nn.Module, colwise: bool, rank: int) -> nn.Module:
    """colwise: rows of elements and codes; rowwise: K on block boundaries (whole bytes, whole codes)."""
    dim = 0 if colwise else 1
    return MXWeightOnly(_shard(m.q, dim, rank), _shard(m.e, dim, rank), m.elem)


# Attention in e4m3, the FFN in packed e2m1: one block covers both element kinds.
MX_ELEM = {"wq": "e4m3", "wk": "e4m3", "wv": "e4m3", "wo": "e4m3", "w1": "e2m1", "w3": "e2m1", "w2": "e2m1"}


Maker = Callable[[str, torch.Tensor, torch.dtype], nn.Module]  # (linear name, float weight, dtype) -> module


@dataclass(frozen=True)
class Family:
    """A hand-written quantized family: its FFN width, how it quantizes a float weight, how gpt-fast shards
    a linear, and how the float64 reference dequantizes one."""

    hidden: int
    make: Maker
    shard: Callable[[nn.Module, bool, int], nn.Module]  # (module, colwise, rank)
    dequant_f64: Callable[[nn.Module], torch.Tensor]


def _int8(cls: type, scale_dtype: torch.dtype | None) -> Maker:
    def make(name: str, w: torch.Tensor, dtype: torch.dtype) -> nn.Module:
        q, s = quantize_per_row_int8(w)
        return cls(q, s.to(scale_dtype or dtype))

    return make


def _int8_f64(m: nn.Module) -> torch.Tensor:
    return m.weight.double() * m.scales.double()[:, None]


def _mx_make(name: str, w: torch.Tensor, dtype: torch.dtype) -> nn.Module:
    return MXWeightOnly(*fmt.quantize(w, MX_ELEM[name]), MX_ELEM[name])


FAMILIES = {
    "woq_int8": Family(HIDDEN, _int8(WoqInt8, None), _int8_shard, _int8_f64),
    "dynamic_int8": Family(HIDDEN, _int8(DynInt8, torch.float32), _int8_shard, _int8_f64),
    "mx": Family(MX_HIDDEN, _mx_make, _mx_shard, lambda m: fmt.dequantize_f64(m.q, m.e, m.elem)),
}


def all_reduce_hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(output, "sum", list(range(WORLD)))


def gpt_fast_shard(block: Block, family: Family, rank: int) -> Block:
    """gpt-fast `tp.py`'s `_apply_tp_Transformer` on one block: shard every linear, all-reduce the outputs of
    attention and feed_forward (forward hooks, as gpt-fast registers them)."""
    block = copy.deepcopy(block)
    for name in LINEARS:
        parent = block.get_submodule(name.rsplit(".", 1)[0])
        setattr(parent, short(name), family.shard(getattr(parent, short(name)), name in COLWISE, rank))
    block.attention.register_forward_hook(all_reduce_hook)
    block.feed_forward.register_forward_hook(all_reduce_hook)
    return block


# ------------------------------------------------------------------------------------ float64 reference
@dataclass(frozen=True)
class ActQuant:
    """Symmetric per-token int8 activations in float64: s = amax / `divisor`, codes clamp(round(a / s), qmin,
    127); `groups` > 1 quantizes each of that many K slices with its own per-token scale."""

    divisor: float
    qmin: int
    groups: int = 1

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        parts = []
        for p in a.tensor_split(self.groups, dim=-1):
            s = p.abs().amax(-1, keepdim=True).clamp(min=1e-8) / self.divisor
            parts.append(torch.round(p / s).clamp(self.qmin, 127) * s)
        return torch.cat(parts, -1)


def mx_activations(a: torch.Tensor) -> torch.Tensor:
    """torchao's dynamic MX activations (e4m3, FLOOR scales: the OCP rule `mx_format.quantize` follows)."""
    k = a.shape[-1]
    q, e = fmt.quantize(a.reshape(-1, k).float(), "e4m3")
    return fmt.dequantize_f64(q, e, "e4m3").reshape(a.shape)


class RefLinear(nn.Module):
    def __init__(self, w: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        super().__init__()
        self.w, self.act = w, act

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return (a if self.act is None else self.act(a)) @ self.w.t()


def reference_f64(
    block: Block,
    weights: dict[str, torch.Tensor],
    x: torch.Tensor,
    act: Callable[[str], Callable[[torch.Tensor], torch.Tensor] | None],
) -> torch.Tensor:
    """The unsharded quantized block in float64: its norms, dequantized weights (name -> [N, K]) and, where
    activations are quantized, `act(linear name)`'s quantize-dequantize of the linear's input."""
    ref = Block({n: RefLinear(w, act(n)) for n, w in weights.items()})
    ref.attention_norm.weight.data = block.attention_norm.weight.detach().double()
    ref.ffn_norm.weight.data = block.ffn_norm.weight.detach().double()
    with torch.no_grad():
        return ref(x.double())


def rel_err(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor) -> float:
    """||out - ref|| / ||ref - x||: the residual x is left out of the scale, so an error in either branch
    counts against the branches' own size."""
    return ((out.double() - ref).norm() / (ref - x.double()).norm()).item()


# --------------------------------------------------------------------------------------------- the cases
@dataclass
class Result:
    """One rank's view of one case: its report rows and error vs float64, or the exception it raised."""

    rows: list[dict] = field(default_factory=list)
    err: float | None = None
    error: str | None = None
    seconds: float = 0.0


def compile_and_report(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    import qlower

    torch._dynamo.reset()
    qlower.clear_reports()
    with torch.no_grad():
        out = torch.compile(block, options=qlower.inductor_options())(x)
    rows = [
        {
            "module": d.module,
            "family": d.family,
            "lowering": d.lowering,
            "shape": tuple(int(s) for s in d.shape),
            "form": d.form,
            "reason": d.reason,
        }
        for r in qlower.all_reports()
        for d in r.entries
    ]
    return out, rows


def gpt_fast_act(family_name: str, row_groups: int) -> Callable[[str], ActQuant | None]:
    """The activation quantization of a hand-written family's linears, by short name: DynInt8's per-token
    scale, over `row_groups` K slices in the row-parallel linears."""

    def act(name: str) -> ActQuant | None:
        if family_name != "dynamic_int8":
            return None
        return ActQuant(127.0, -127, row_groups if name in ROWWISE_SHORT else 1)

    return act


def unsharded_block(family_name: str, dtype: torch.dtype) -> tuple[Block, dict[str, torch.Tensor]]:
    """The unsharded hand-written quantized block and its dequantized float64 weights (short name -> [N, K])."""
    family = FAMILIES[family_name]
    full = Block({n: family.make(n, w, dtype) for n, w in float_weights(family.hidden).items()})
    return full, {short(n): family.dequant_f64(full.get_submodule(n)) for n in LINEARS}


def gpt_fast_case(family_name: str, dtype: torch.dtype, rank: int) -> Result:
    x = block_input(dtype)
    full, weights = unsharded_block(family_name, dtype)
    # Each row-parallel shard quantizes its own K slice per token: the unsharded model it computes has one
    # scale per token and shard there (tests/integrations/tp/test_tensor_parallel.py::
    # test_reference_is_the_unsharded_block measures how far that is from one scale over the full K)
    ref = reference_f64(full, weights, x, gpt_fast_act(family_name, WORLD))
    out, rows = compile_and_report(gpt_fast_shard(full, FAMILIES[family_name], rank), x)
    return Result(rows, rel_err(out, ref, x))


def aoti_case(family_name: str, dtype: torch.dtype, rank: int) -> Result:
    """gpt-fast's shard of this rank exported (`torch.export`, the functional all_reduce included) and compiled
    into an AOTInductor package with qlower's options, then loaded and run."""
    import tempfile

    import qlower

    x = block_input(dtype)
    full, weights = unsharded_block(family_name, dtype)
    ref = reference_f64(full, weights, x, gpt_fast_act(family_name, WORLD))
    shard = gpt_fast_shard(full, FAMILIES[family_name], rank)
    qlower.clear_reports()
    with torch.no_grad():
        ep = torch.export.export(shard, (x,))
        path = os.path.join(tempfile.mkdtemp(), f"rank{rank}.pt2")
        # -O0 for the generated wrapper: the package's C++ compile is most of this case's time on 2 cores
        opts = qlower.inductor_options(**{"aot_inductor.compile_wrapper_opt_level": "O0"})
        pkg = torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=opts)
        rows = [
            {"module": d.module, "family": d.family, "lowering": d.lowering, "shape": tuple(int(v) for v in d.shape),
             "form": d.form, "reason": d.reason}
            for r in qlower.all_reports() for d in r.entries
        ]  # fmt: skip
        out = torch._inductor.aoti_load_package(pkg)(x)
    return Result(rows, rel_err(out, ref, x))


def register_int_mm_sharding() -> None:
    """DTensor has no sharding rule for `aten._int_mm` (torch 2.13): register mm's (both replicated, column
    split, row split -> partial sum), as a user of torchao's dynamic int8 on DTensor has to. It stays
    registered for the rest of the process."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    @register_sharding(torch.ops.aten._int_mm.default)
    def _int_mm_strategy(a, b):
        return [
            ([Replicate()], [Replicate(), Replicate()]),
            ([Shard(1)], [Replicate(), Shard(1)]),
            ([Shard(0)], [Shard(0), Replicate()]),
            ([Partial()], [Shard(1), Shard(0)]),
        ]


def torchao_config(family: str):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    if family == "woq_int8":
        return Int8WeightOnlyConfig()
    if family == "dynamic_int8":
        return Int8DynamicActivationInt8WeightConfig()
    # torchao 0.18 has no MX weight-only config: dynamic MX activations, e4m3 weights, emulated kernels
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    return MXDynamicActivationMXWeightConfig(
        kernel_preference=KernelPreference.EMULATED, scaling_mode=ScaleCalculationMode.FLOOR
    )


def dtensor_case(family: str, dtype: torch.dtype, rank: int, int_mm_rule: bool) -> Result:
    """torchtitan's order: parallelize_module on the float block, then quantize_ (torchao wraps each DTensor
    shard: Int8Tensor(qdata=DTensor, scale=DTensor)); the reference quantizes an unsharded copy the same way."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torchao.quantization import quantize_

    if int_mm_rule:
        register_int_mm_sharding()
    linears = {}
    for n, w in float_weights(FAMILIES[family].hidden).items():
        linears[n] = nn.Linear(w.shape[1], w.shape[0], bias=False)
        linears[n].weight.data = w
    block = Block(linears).to(dtype)
    full = copy.deepcopy(block)
    quantize_(full, torchao_config(family))
    plan = {n: ColwiseParallel() if n in COLWISE else RowwiseParallel() for n in LINEARS}
    parallelize_module(block, init_device_mesh("cpu", (WORLD,)), plan)
    quantize_(block, torchao_config(family))
    x = block_input(dtype)

    # Int8Tensor / MXTensor: int8 or fp8 elements times their scales, exact in fp32
    weights = {short(n): full.get_submodule(n).weight.dequantize(torch.float32).double() for n in LINEARS}
    act: Callable[[torch.Tensor], torch.Tensor] | None = None
    if family == "dynamic_int8":
        # torchao's symmetric per-token int8: s = amax / 127.5, codes in [-128, 127]; DTensor all-reduces the
        # row-parallel amax (max), so each token has one scale over the full K. A token's negative extreme
        # lands on the tie -127.5, its code (-127 or -128) set by the last bit of s: even at fp32 about one
        # code per token differs from float64's
        act = ActQuant(127.5, -128)
    elif family == "mx":
        act = mx_activations
    ref = reference_f64(full, weights, x, lambda _n: act)
    out, rows = compile_and_report(block, x)
    return Result(rows, rel_err(out, ref, x))


def run_case(case: str, rank: int) -> Result:
    """`flow:family:dtype[:int_mm_rule]`; an exception becomes the Result's `error` (the exact text)."""
    flow, family, dt, *extra = case.split(":")
    saved = torch._inductor.config.get_config_copy()  # torchao's quantize_ flips global Inductor knobs
    try:
        if flow == "gpt_fast":
            return gpt_fast_case(family, getattr(torch, dt), rank)
        if flow == "aoti":
            return aoti_case(family, getattr(torch, dt), rank)
        return dtensor_case(family, getattr(torch, dt), rank, "int_mm_rule" in extra)
    except Exception as e:
        return Result(error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}")
    finally:
        torch._inductor.config.load_config(saved)


def worker(rank: int, port: int, cases: list[str], out_dir: str) -> None:
    """One rank (torch.multiprocessing.spawn's entry): every case, results pickled to out_dir/rank<r>.pkl."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Each rank its own Inductor cache folder: the two ranks' shards have the same shapes, so their AOTInductor
    # compiles share cache keys, and one rank read a file the other was still writing ("parse error ...
    # empty input" loading the package, seen once under CI's two pytest workers)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(out_dir, f"inductor_rank{rank}")
    torch.set_num_threads(1)  # two ranks on the CI's two cores
    torch._inductor.config.compile_threads = 1
    torch._inductor.config.fx_graph_cache = False  # every case runs qlower's pass (a cache hit would not)
    torch._functorch.config.enable_autograd_cache = False
    # a collective waits this long for its peer: the hang guard, not a speed limit (a peer still compiling on
    # cores another pytest worker shares took over 120 s once; a peer that died fails the parent's join at once)
    timeout = datetime.timedelta(seconds=SUBPROCESS_TIMEOUT_S)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timeout)
    results: dict[str, Result] = {}
    try:
        for case in cases:
            start = time.perf_counter()
            results[case] = run_case(case, rank)
            results[case].seconds = time.perf_counter() - start
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        dist.destroy_process_group()
