"""The CUTLASS lowerings of CUDA: when qlower's CUTLASS W8A16 GEMM (sm_90a) computes a woq-int8 record, and
when AUTO prefers it.

Correct (`supports`): capability 9.0 exactly (the library holds sm_90a code alone), bf16/fp16 x, an int8
weight stored [N, K] with K contiguous, K % 16 == 0 and N % 8 == 0 (16-byte TMA rows), a scale of x's
dtype (or a number that dtype holds exactly), the same fp16 range rules as the Triton kernel, and a built
library (`kernels/cutlass/build.py`: a missing nvcc or CUTLASS is the reason in the report); under
AOTInductor also the library's objects, which the op's C shim links into the package (lowerings/aoti/build.py;
tests/integrations/aoti/test_aoti_cutlass.py), unless `QLOWER_AOTI_CUTLASS=0` keeps packages on the Triton kernels.
The MXFP4 lowering (`MXFP4_CUTLASS`, below) follows the same rules with its own operands.
Preferred (`prefer`, AUTO): a static M in `CUTLASS_W8A16_M_RANGE`, and a symbolic M under CUDA graphs or in a
C++-wrapper compile (AOTInductor, cpp_wrapper: the branch on M is a C++ `if`), which gets qlower's Triton op with
this GEMM as its branch above the range's start (emit/cutlass.py). It is ranked before the Triton
lowering, which keeps a static M up to 127; dequant + cuBLAS keeps a static M above the range (`devices/crossovers.py`,
from BENCHMARKS.md, "CUDA, woq_int8, CUTLASS W8A16").
"""

from __future__ import annotations

import functools
import os

import torch
from torch import fx

from qlower.lowerings.devices import crossovers
from qlower.lowerings.devices.capability import cuda_capability, describe_capability
from qlower.lowerings.devices.common import spec_layout_blocker, weight_scale_range_blocker
from qlower.lowerings.devices.crossovers import CUTLASS_W8A16_M_RANGE
from qlower.lowerings.emit.cutlass import emit_mxfp4_cutlass, emit_woq_int8_cutlass
from qlower.lowerings.kernels.cutlass.configs import (
    K_MULTIPLE,
    MXFP4_K_MULTIPLE,
    MXFP4_N_MULTIPLE,
    N_MULTIPLE,
)
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering
from qlower.lowerings.scale_facts import scale_after_kernel
from qlower.lowerings.symbolic_m import host_branches
from qlower.patterns.graph_utils import is_static, tensor_val
from qlower.patterns.record import QuantLinear

SM90A = (9, 0)
AOTI_SWITCH = "QLOWER_AOTI_CUTLASS"


def _aoti() -> bool:
    from torch._inductor import config as inductor_config
    from torch._inductor.virtualized import V

    return bool(inductor_config.cpp_wrapper or getattr(V, "aot_compilation", False))


def _scale_blocker(rec: QuantLinear) -> str | None:
    s = rec.weight_scale
    dtype = rec.compute_dtype
    if s is None:
        return None
    if isinstance(s, (int, float)):
        held = float(torch.tensor(float(s), dtype=dtype)) == float(s)
        return None if held else f"the scale {s} is not exactly a {dtype} value (the kernel takes x's dtype)"
    v = tensor_val(s)
    if v is None or v.dtype != dtype:
        return f"scale dtype {None if v is None else v.dtype} (the kernel takes x's dtype {dtype})"
    if v.numel() not in (1, int(rec.n)):
        return f"scale of {v.numel()} values (the kernel takes {rec.n} or 1)"
    return None


def _operand_blocker(rec: QuantLinear) -> str | None:
    if rec.compute_dtype not in (torch.bfloat16, torch.float16):
        return f"activation dtype {rec.compute_dtype} (the kernel takes bf16/fp16)"
    xv, wv = tensor_val(rec.x), tensor_val(rec.weight)
    if xv is None or xv.dtype != rec.compute_dtype or xv.dim() != 2:
        return "x is not a 2-D tensor of the compute dtype"
    if wv is None or wv.dtype != torch.int8 or wv.dim() != 2:
        return "weight is not a 2-D int8 tensor"
    if rec.weight_layout != "NK" or wv.stride(-1) != 1:
        return "weight is not stored [N, K] with K contiguous (the kernel's TMA rows)"
    if not (is_static(rec.k) and is_static(rec.n)):
        return f"K={rec.k} or N={rec.n} is dynamic"
    if int(rec.k) % K_MULTIPLE or int(rec.n) % N_MULTIPLE or int(rec.n) == 0:
        return f"needs K % {K_MULTIPLE} == 0 and N % {N_MULTIPLE} == 0 (K={rec.k}, N={rec.n})"
    return None


def _device_blocker(rec: QuantLinear) -> str | None:
    if rec.device.type != "cuda":
        return f"device {rec.device} is not CUDA"
    cap = cuda_capability(rec.device)
    if cap != SM90A:
        return f"the CUTLASS library holds sm_90a code, for capability 9.0 only; this device's is {describe_capability(cap)}"
    return None


def _aoti_switch_blocker() -> str | None:
    if _aoti() and os.environ.get(AOTI_SWITCH, "1") == "0":
        return f"AOTInductor: {AOTI_SWITCH}=0 keeps packages on the Triton kernels (no nvcc objects linked)"
    return None


def supports_woq_int8_cutlass(rec: QuantLinear) -> str | None:
    why = _device_blocker(rec) or _aoti_switch_blocker()
    if why:
        return why
    why = _operand_blocker(rec) or _scale_blocker(rec) or weight_scale_range_blocker(rec)
    if why:
        return why
    if scale_after_kernel(rec):
        return "fp16 x with a wider scale: the graph's product has fp32's range (the Triton lowering scales after)"
    return None


def cutlass_library_built() -> str | None:
    """The library, built at the first choice that takes the kernel (minutes of nvcc, then cached), else why not;
    under AOTInductor its objects, which the op's C shim links into the package."""
    from qlower.lowerings.kernels.cutlass import build

    if _aoti():
        objects = build.objects()
        if isinstance(objects, str):
            return f"AOTInductor: the package links the CUTLASS objects, and there are none: {objects}"
        return None
    lib = build.library()
    return lib if isinstance(lib, str) else None


def prefer_woq_int8_cutlass(rec: QuantLinear) -> str | None:
    lo, hi = CUTLASS_W8A16_M_RANGE
    if not is_static(rec.m):
        from torch._inductor import config as inductor_config

        if not (inductor_config.triton.cudagraphs or _aoti()):
            return (
                "a symbolic M without CUDA graphs in a Python-wrapper compile keeps the Triton op's host branch "
                "(dequant + cuBLAS above its crossover): the CUTLASS branch is measured and tested under CUDA "
                "graphs and AOTInductor"
            )
        return None  # the Triton op up to lo - 1, this GEMM above: launches gated by M (emit.cutlass)
    m = int(rec.m)
    if m < lo or (hi is not None and m > hi):
        return f"M={m} outside the CUTLASS kernel's measured range [{lo}, {hi or 'any'}] on sm_90"
    return None


def _gpu_name(rec: QuantLinear) -> tuple[str, bool]:
    """The record's GPU's name, whether it is that GPU's (else the fallback table's, e.g. a fake-tensor trace)."""
    from qlower.lowerings.kernels.cutlass import configs

    try:
        return configs.device_name(rec.device.index or 0), True
    except (RuntimeError, AssertionError, AttributeError):
        return configs.FALLBACK_DEVICE, False


def cutlass_configuration(rec: QuantLinear) -> str:
    """The tile, cluster, schedule and split the kernel runs for this record (the tuned table's choice at a
    static M, `configs.choose`; a symbolic M's is made per call from the same table)."""
    from qlower.lowerings.kernels.cutlass import configs

    name, own = _gpu_name(rec)
    table = f"{name}'s table" if own and name in configs.TUNED else f"{configs.FALLBACK_DEVICE}'s table"
    if not (is_static(rec.m) and is_static(rec.n) and is_static(rec.k)):
        return f"configuration chosen per call by M from {table} (lowerings/kernels/cutlass/tuned/)"
    choice = configs.choose(int(rec.m), int(rec.n), int(rec.k), name)
    split = f", split-K {choice.splits}" if choice.splits else ""
    return f"configuration {choice.config}{split} ({table})"


WOQ_INT8_CUTLASS = Lowering(
    name="cutlass.woq_int8_w8a16",
    family="woq_int8",
    kind=KernelPreference.CUTLASS,
    supports=supports_woq_int8_cutlass,
    prefer=prefer_woq_int8_cutlass,
    available=cutlass_library_built,
    emit=functools.partial(emit_woq_int8_cutlass, triton_max_m=CUTLASS_W8A16_M_RANGE[0] - 1),
    doc="qlower CUTLASS W8A16 GEMM (sm_90a): int8 weight converted in registers, scale and bias in the epilogue",
    detail=cutlass_configuration,
)


# --------------------------------------------------------------------- MXFP4 weight-only
def supports_mxfp4_cutlass(rec: QuantLinear) -> str | None:
    """Weight-only MX with e2m1 elements in 32-element blocks (the OCP layout), bf16 x and output, the weight
    stored [N, K/2] bytes, static K a multiple of the kernel's K tile (128) and N of 8. Under AOTInductor the
    op's C shim links the library's objects into the package, as for W8A16 (`QLOWER_AOTI_CUTLASS=0`: no)."""
    why = _device_blocker(rec) or _aoti_switch_blocker()
    if why:
        return why
    d = rec.weight_mx
    if d is None or d.elem != "e2m1" or rec.weight_block != 32:
        return "not MXFP4 (e2m1 elements, one scale per 32)"
    if rec.act_quant is not None:
        return "MX activations: the kernel takes bf16 x (weight-only MX)"
    xv = tensor_val(rec.x)
    if rec.compute_dtype != torch.bfloat16 or xv is None or xv.dtype != torch.bfloat16 or xv.dim() != 2:
        return f"activation dtype {rec.compute_dtype}: the kernel takes 2-D bf16 x (fp16 x keeps the Triton kernels)"
    if rec.out_dtype != torch.bfloat16:
        return f"output dtype {rec.out_dtype} (the kernel writes bf16)"
    if rec.weight_layout != "NK":
        return "weight is not stored [N, K/2] (the kernel's TMA rows run along K)"
    if not (is_static(rec.k) and is_static(rec.n)):
        return f"K={rec.k} or N={rec.n} is dynamic"
    k, n = int(rec.k), int(rec.n)
    if k % MXFP4_K_MULTIPLE or n % MXFP4_N_MULTIPLE or n == 0:
        return f"needs K % {MXFP4_K_MULTIPLE} == 0 and N % {MXFP4_N_MULTIPLE} == 0 (K={k}, N={n})"
    return spec_layout_blocker(rec)


def prefer_mxfp4_cutlass(rec: QuantLinear) -> str | None:
    """AUTO: a static M in `crossovers.CUTLASS_MXFP4_M_RANGE`; a symbolic M gets the Triton MX op with this
    GEMM as its run-time choice in the range (emit.cutlass.emit_mxfp4_cutlass): host-branch leaves calling the
    op (C++ wrappers too), or under CUDA graphs gated buckets choosing per call in Python. None: not measured
    on hardware, so AUTO leaves it to the Triton op (KernelPreference.CUTLASS runs it)."""
    if crossovers.CUTLASS_MXFP4_M_RANGE is None:
        return "not measured on an sm_90 GPU yet (crossovers.CUTLASS_MXFP4_M_RANGE): KernelPreference.CUTLASS runs it"
    lo, hi = crossovers.CUTLASS_MXFP4_M_RANGE
    if not is_static(rec.m):
        if _aoti() and not host_branches(rec):
            return (
                f"AOTInductor with M={rec.m}, not one size symbol: the gated buckets' run-time choice "
                "(`qlower::mxfp4_dense`) runs in Python wrappers alone; the Triton MX kernels serve"
            )
        return None
    m = int(rec.m)
    if m < lo or (hi is not None and m > hi):
        return f"M={m} outside the MXFP4 CUTLASS kernel's measured range [{lo}, {hi or 'any'}] on sm_90"
    return None


def _emit_mxfp4_cutlass(graph: fx.Graph, rec: QuantLinear, preference: KernelPreference) -> fx.Node:
    """The emitter with the range's start read when it runs (`crossovers.CUTLASS_MXFP4_M_RANGE`)."""
    return emit_mxfp4_cutlass(graph, rec, preference, crossovers.CUTLASS_MXFP4_M_RANGE or (1, None))


def mxfp4_configuration(rec: QuantLinear) -> str:
    """The tile, cluster, schedule and split the kernel runs (`mxfp4.choose`, per call for a symbolic M)."""
    from qlower.lowerings.kernels.cutlass import mxfp4

    if not (is_static(rec.m) and is_static(rec.n) and is_static(rec.k)):
        return "configuration chosen per call by M (lowerings/kernels/cutlass/mxfp4.py: choose)"
    choice = mxfp4.choose(int(rec.m), int(rec.n), int(rec.k))
    split = f", split-K {choice.splits}" if choice.splits else ""
    return f"configuration {choice.config}{split}"


MXFP4_CUTLASS = Lowering(
    name="cutlass.mxfp4_weight_only",
    family="mx",
    kind=KernelPreference.CUTLASS,
    supports=supports_mxfp4_cutlass,
    prefer=prefer_mxfp4_cutlass,
    available=cutlass_library_built,
    emit=_emit_mxfp4_cutlass,
    doc="qlower CUTLASS MXFP4 GEMM (sm_90a): e2m1 converted in registers with each 32-block's scale, bias in the epilogue",
    detail=mxfp4_configuration,
)
