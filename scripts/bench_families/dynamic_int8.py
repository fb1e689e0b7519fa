"""dynamic_int8 cases for scripts/bench.py: per-token int8 activations x per-channel int8 weights.

    python -m scripts.bench --family dynamic_int8 --device cpu [--quick]
    python -m scripts.bench --family dynamic_int8 --device cuda --shapes 4096x4096x14336
    python -m scripts.bench_families.dynamic_int8 [OUT.json]   # cuda_quick: the H200 target in one short run

The model is the hand-written form (what torchao's Int8DynamicActivationInt8WeightConfig flattens to):
quantize x per token in the graph, `torch._int_mm`, rescale by x_scale * w_scale in fp32. Stock compile and
qlower receive the same function. On CUDA, cuBLASLt `_int_mm` rejects M <= 16, so the stock/eager function
pads such M itself (the usual user work-around); qlower receives the unpadded form and decides.
The interface every family module of bench_families/ follows is documented at the top of bench.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qlower.quantize import quantize_per_row_int8

FAMILY = "dynamic_int8"
DTYPE = torch.bfloat16
GRID_M = (1, 16, 128, 1024)
GRID_M_CUDA = (1, 16, 128, 1024, 4096)
GRID_KN = ((4096, 4096), (4096, 14336))
QUICK_M = (1, 128)
QUICK_KN = ((4096, 4096),)
CUDA_MIN_M = 17


def make_weights(k: int, n: int, device: str, seed: int) -> dict[str, torch.Tensor]:
    """The bf16 weight [N, K], its int8 per-row quantization q [N, K] and fp32 scales s [N]."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(DTYPE)
    q, s = quantize_per_row_int8(w)
    return {"bf16": w.to(device), "q": q.to(device), "s": s.to(device)}


def quant_bytes(k: int, n: int) -> int:
    """int8 weight [N, K] plus fp32 scales [N]."""
    return n * k + 4 * n


def _quantize(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x2.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-8) / 127.0
    return torch.round(x2 / s).clamp(-127, 127).to(torch.int8), s


def _linear(x: torch.Tensor, w: dict[str, torch.Tensor], pad_small_m: bool) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    xq, s = _quantize(x2)
    m = xq.shape[0]
    if pad_small_m and xq.is_cuda and m < CUDA_MIN_M:
        acc = torch._int_mm(F.pad(xq, (0, 0, 0, CUDA_MIN_M - m)), w["q"].t())[:m]
    else:
        acc = torch._int_mm(xq, w["q"].t())
    y = acc * s * w["s"]
    return y.to(x.dtype).reshape(*x.shape[:-1], -1)


def dynamic_int8_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model as users write it (eager-safe on CUDA: pads M <= 16)."""
    return _linear(x, w, pad_small_m=True)


def dynamic_int8_linear_plain(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same model without the CUDA work-around (identical to the above on CPU)."""
    return _linear(x, w, pad_small_m=False)


def bf16_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.linear(x, w["bf16"])


class _Linear(torch.nn.Module):
    """One weight set as buffers: what freezing turns into constants."""

    def __init__(self, w: dict[str, torch.Tensor], pad_small_m: bool) -> None:
        super().__init__()
        self.register_buffer("q", w["q"])
        self.register_buffer("s", w["s"])
        self.pad_small_m = pad_small_m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, {"q": self.q, "s": self.s}, self.pad_small_m)


class Frozen:
    """fn(x, weights) for a deployment with `torch._inductor.config.freezing = True`: one module per weight
    set, compiled (per shape) with its weights frozen into constants. `qlower=False`: stock compile."""

    def __init__(self, qlower: bool) -> None:
        self.qlower = qlower
        self.compiled: dict[int, object] = {}

    def __call__(self, x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        import qlower

        key = id(w["q"])
        if key not in self.compiled:
            opts = qlower.inductor_options(families=(FAMILY,)) if self.qlower else {}
            # stock gets the CUDA work-around (cuBLASLt _int_mm rejects M <= 16), qlower the plain form
            self.compiled[key] = torch.compile(_Linear(w, not self.qlower), dynamic=False, options=opts)
        with torch._inductor.config.patch(freezing=True):
            return self.compiled[key](x)  # type: ignore[operator]


# name -> (fn, how to run it): None = eager, "stock" = torch.compile, "qlower" = torch.compile + qlower.
# The *_frozen variants compile themselves (freezing on: weights are constants, as in a CPU deployment).
VARIANTS = {
    "bf16": (bf16_linear, None),
    "stock": (dynamic_int8_linear, "stock"),
    "eager_int8": (dynamic_int8_linear, None),
    "qlower": (dynamic_int8_linear_plain, "qlower"),
    "stock_frozen": (Frozen(qlower=False), None),
    "qlower_frozen": (Frozen(qlower=True), None),
}


def _do_bench(fn, device: str) -> float:
    """Median milliseconds: triton's do_bench on CUDA, a plain timer elsewhere (for dry runs)."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=50, rep=300)
    import statistics
    import time

    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def cuda_quick(
    out: str | None = None,
    device: str = "cuda",
    k: int = 4096,
    n: int = 14336,
    ms: tuple[int, ...] = (1, 16, 4096),
) -> dict[str, object]:
    """H200 check of the issue's target in one short run: M=4096, 4096->14336 (and M=1, 16), bf16 F.linear vs
    qlower's `_int_mm` lowering (kernel_preference=ATEN), qlower AUTO and stock compile; rotating weights."""
    import json

    import qlower

    rotate = 8
    sets = [make_weights(k, n, device, seed) for seed in range(rotate)]
    opts = dict(families=(FAMILY,))
    variants = {
        "bf16": bf16_linear,
        "stock": torch.compile(dynamic_int8_linear, dynamic=False),
        "qlower_aten": torch.compile(
            dynamic_int8_linear_plain,
            dynamic=False,
            options=qlower.inductor_options(**opts, kernel_preference="aten"),
        ),
        "qlower_auto": torch.compile(
            dynamic_int8_linear_plain, dynamic=False, options=qlower.inductor_options(**opts)
        ),
    }
    results: dict[str, object] = {}
    for m in ms:
        x = torch.randn(1, m, k, device=device, dtype=DTYPE)
        ref = dynamic_int8_linear(x, sets[0]).float()
        times = {}
        for name, fn in variants.items():
            with torch.no_grad():
                y = fn(x, sets[0]).float()
                if name.startswith("qlower"):
                    results[f"M={m} {name} lowering"] = [d.lowering for d in qlower.last_report()]
                results[f"M={m} {name} rel_err"] = ((y - ref).abs().max() / ref.abs().max()).item()
                calls = iter(range(10**9))
                times[name] = 1e3 * _do_bench(
                    lambda fn=fn, x=x, calls=calls: fn(x, sets[next(calls) % rotate]), device
                )
        for name, us in times.items():
            results[f"M={m} {name} us"] = round(us, 1)
            results[f"M={m} {name} vs bf16"] = round(times["bf16"] / us, 3)
    text = json.dumps(results, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return results


if __name__ == "__main__":
    import sys

    torch._inductor.config.fx_graph_cache = False
    cuda_quick(sys.argv[1] if len(sys.argv) > 1 else None)
