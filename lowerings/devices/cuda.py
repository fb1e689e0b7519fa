"""CUDA backend: every family's CUDA lowerings and the rules that say when each is correct or preferred.

Never `_weight_int8pack_mm` here: on sm_90 it is a naive kernel, 9-770x slower than bf16 (BENCHMARKS.md,
"CUDA, woq_int8", the stock column).
- woq_int8: qlower's CUTLASS W8A16 GEMM for a static M in its measured range (devices/cuda_cutlass.py), qlower's
  Triton kernel where measured faster (`prefer`: static M up to its crossover, any symbolic M), else fused
  dequant + cuBLAS (what stock Inductor generates, so AUTO is never slower than stock).
- dynamic_int8: the Triton int8 kernel where measured faster, cuBLASLt `_int_mm` (M padded to 17), emulation.
- mx: cuBLAS `_scaled_mm` with MX block scales (capability >= 10.0), qlower's Triton MX kernels (>= 8.9),
  emulation. An explicit `kernel_preference=TRITON` takes a Triton kernel at any M (its `supports`); AUTO
  also asks its `prefer` rule, the measured crossover. In a training compile AUTO leaves the MX x MX products
  that would be emulated to stock Inductor (`_prefer_mx_emulated`): there qlower's emulation measured slower.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from qlower.lowerings.devices import crossovers
from qlower.lowerings.devices.capability import (
    cuda_capability,
    describe_capability,
    override_cuda_capability,  # noqa: F401  (tests use it here)
)
from qlower.lowerings.devices.common import int8_operands, spec_layout_blocker, weight_scale_range_blocker
from qlower.lowerings.devices.cuda_cutlass import MXFP4_CUTLASS, WOQ_INT8_CUTLASS
from qlower.lowerings.devices.emulated import DYNAMIC_INT8_EMULATED, MX_EMULATED, WOQ_INT8_DEQUANT_MM
from qlower.lowerings.emit.dynamic_int8 import make_emit_int_mm_min_m
from qlower.lowerings.emit.mx import emit_scaled_mm
from qlower.lowerings.emit.triton_int8 import emit_dynamic_int8, emit_woq_int8
from qlower.lowerings.emit.triton_mx import emit_mx_triton
from qlower.lowerings.kernels.triton import triton_unavailable
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering, register_backend
from qlower.patterns import mx_format as fmt
from qlower.patterns.graph_utils import differentiates, is_static, known_eq, tensor_val
from qlower.patterns.record import QuantLinear

_ACT_DTYPES = (torch.bfloat16, torch.float16)  # the Triton kernels' activations
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TRITON_INT8_MIN_CAPABILITY = (8, 0)  # bf16 and int8 tensor-core dots in Triton; measured on sm_90 only
TRITON_MX_MIN_CAPABILITY = (8, 9)  # Triton fp8


def describe(device: torch.device) -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return f"{device} ({torch.cuda.get_device_name(device)}, capability {major}.{minor})"
    return f"{device} (capability unknown: CUDA not available in this process)"


# --------------------------------------------------------------------- dynamic_int8: cuBLASLt
CUDA_MIN_M = 17  # cuBLASLt int8: self.size(0) > 16


CUDA_KN_MULTIPLE = 8


def _supports_cuda_int_mm(rec: QuantLinear) -> str | None:
    why = int8_operands(rec)
    if why:
        return why
    if rec.k % CUDA_KN_MULTIPLE or rec.n % CUDA_KN_MULTIPLE:
        return f"cuBLASLt int8 needs K % 8 == 0 and N % 8 == 0 (K={rec.k}, N={rec.n})"
    if rec.k == 0:
        return "K == 0"
    return None


DYNAMIC_INT8_INT_MM_CUDA = Lowering(
    name="aten._int_mm",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_cuda_int_mm,
    emit=make_emit_int_mm_min_m(CUDA_MIN_M),
    doc="cuBLASLt int8 GEMM (M padded to 17 when smaller or dynamic), fused quantize and rescale",
)


# --------------------------------------------------------------------- mx: cuBLAS block-scaled
SCALED_MM_MIN_CAPABILITY = (10, 0)  # cuBLAS block-scaled (MX) GEMMs: Blackwell and newer


def supports_scaled_mm(rec: QuantLinear) -> str | None:
    if rec.device.type != "cuda":
        return f"device {rec.device} is not CUDA"
    cap = cuda_capability(rec.device)
    if cap is None or cap < SCALED_MM_MIN_CAPABILITY:
        need = ".".join(map(str, SCALED_MM_MIN_CAPABILITY))
        return (
            f"MX block-scaled cuBLAS GEMMs need CUDA capability >= {need}; this device's is "
            f"{describe_capability(cap)} (cuBLAS would fail with CUBLAS_STATUS_NOT_SUPPORTED at run time)"
        )
    aq = rec.act_quant
    if aq is None:
        return "weight-only MX: _scaled_mm needs both operands MX-quantized"
    assert aq.mx is not None and rec.weight_mx is not None
    a_elem, w_elem = aq.mx.elem, rec.weight_mx.elem
    if a_elem != w_elem or a_elem not in ("e4m3", "e2m1"):
        return f"_scaled_mm takes MXFP8 e4m3 x e4m3 or MXFP4 x MXFP4, not {a_elem} x {w_elem}"
    if rec.n % 16 or rec.k % 32:
        return f"_scaled_mm needs N % 16 == 0 and K % 32 == 0 (N={rec.n}, K={rec.k})"
    if rec.compute_dtype not in _OUT_DTYPES:
        return f"output dtype {rec.compute_dtype}"
    return spec_layout_blocker(rec)


MX_SCALED_MM = Lowering(
    name="aten._scaled_mm.mx",
    family="mx",
    kind=KernelPreference.ATEN,
    supports=supports_scaled_mm,
    emit=emit_scaled_mm,
    doc=f"cuBLAS MX GEMM (_scaled_mm v1, swizzled e8m0 scales, block {fmt.BLOCK}); capability >= 10.0",
)


# --------------------------------------------------------------------- woq / dynamic int8: Triton
def _platform(rec: QuantLinear) -> str | None:
    why = triton_unavailable()
    if why:
        return why
    device = rec.device
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if not torch.cuda.is_available():
        return "CUDA is not available in this process (capability unknown)"
    cap = torch.cuda.get_device_capability(device)
    if cap < TRITON_INT8_MIN_CAPABILITY:
        return (
            f"capability {cap[0]}.{cap[1]} < {TRITON_INT8_MIN_CAPABILITY[0]}.{TRITON_INT8_MIN_CAPABILITY[1]}"
        )
    return None


def _is_int8_2d(node: object) -> bool:
    v = tensor_val(node)
    return v is not None and v.dtype == torch.int8 and v.dim() == 2


def _per_channel_or_tensor(node: object, n: int, what: str) -> str | None:
    if node is None or isinstance(node, (int, float)):
        return None
    v = tensor_val(node)
    if v is None or not v.dtype.is_floating_point:
        return f"{what} is not a float tensor"
    if not (known_eq(v.numel(), n) or known_eq(v.numel(), 1)):
        return f"{what} has {v.numel()} elements, expected {n} or 1"
    return None


def _static_kn(rec: QuantLinear) -> str | None:
    if not (is_static(rec.k) and is_static(rec.n)):
        return f"K={rec.k} or N={rec.n} is dynamic (configs are chosen per static K, N)"
    if int(rec.k) == 0 or int(rec.n) == 0:
        return "K or N is 0"
    return None


def _crossover(rec: QuantLinear, max_m: int | None, other: str) -> str | None:
    """AUTO only: decline a static M where the kernel was measured slower than `other`. A symbolic M is taken:
    the op launches, per M bucket, the kernel a static M there gets, and (woq-int8) hands M above the crossover
    to dequant + cuBLAS itself (`kernels.triton.int8.ops._run`; the emitter gets the crossover as `dense_above`)."""
    if is_static(rec.m) and max_m is not None and int(rec.m) > max_m:
        return f"M={int(rec.m)} > {max_m}: measured slower than {other} on sm_90"
    return None


def _woq_int8_correct(rec: QuantLinear) -> str | None:
    why = _platform(rec)
    if why:
        return why
    if rec.compute_dtype not in _ACT_DTYPES:
        return f"activation dtype {rec.compute_dtype} (the kernel takes bf16/fp16)"
    xv = tensor_val(rec.x)
    if xv is None or xv.dtype != rec.compute_dtype or xv.dim() != 2:
        return "x is not a 2-D tensor of the compute dtype"
    if not _is_int8_2d(rec.weight):
        return "weight is not a 2-D int8 tensor"
    why = _static_kn(rec)
    if why:
        return why
    return _per_channel_or_tensor(rec.weight_scale, rec.n, "weight scale") or weight_scale_range_blocker(rec)


def _dynamic_int8_correct(rec: QuantLinear) -> str | None:
    why = _platform(rec)
    if why:
        return why
    aq = rec.act_quant
    if aq is None or aq.scheme not in ("per_token_symmetric", "per_tensor_symmetric"):
        return f"activation quantization {aq.scheme if aq else None} (the kernel takes symmetric int8)"
    if rec.weight_zero_point is not None:
        return "weight has a zero point"
    xqv = tensor_val(aq.x_q)
    if xqv is None or xqv.dtype != torch.int8 or not _is_int8_2d(rec.weight):
        return "x_q or weight is not an int8 tensor"
    if rec.out_dtype not in _OUT_DTYPES:
        return f"output dtype {rec.out_dtype}"
    why = _static_kn(rec)
    if why:
        return why
    return _per_channel_or_tensor(aq.x_scale, rec.m, "activation scale") or _per_channel_or_tensor(
        rec.weight_scale, rec.n, "weight scale"
    )


def _prefer_woq_int8(rec: QuantLinear) -> str | None:
    return _crossover(rec, crossovers.WOQ_INT8_TRITON_MAX_M, "dequant + mm")


def _prefer_dynamic_int8(rec: QuantLinear) -> str | None:
    return _crossover(rec, crossovers.DYNAMIC_INT8_TRITON_MAX_M, "the next CUDA lowering")


WOQ_INT8_TRITON = Lowering(
    name="triton.woq_int8_linear",
    family="woq_int8",
    kind=KernelPreference.TRITON,
    supports=_woq_int8_correct,
    prefer=_prefer_woq_int8,
    emit=functools.partial(emit_woq_int8, dense_above=crossovers.WOQ_INT8_TRITON_MAX_M),
    doc="qlower Triton kernel: int8 weight converted in the main loop (GEMV at tiny M, tensor cores above)",
)


DYNAMIC_INT8_TRITON = Lowering(
    name="triton.int8_dynamic_linear",
    family="dynamic_int8",
    kind=KernelPreference.TRITON,
    supports=_dynamic_int8_correct,
    prefer=_prefer_dynamic_int8,
    emit=emit_dynamic_int8,
    doc="qlower Triton kernel: int8 x int8 tensor-core matmul, x_scale * w_scale and bias in the epilogue",
)


# --------------------------------------------------------------------- mx: Triton
def supports_mx_triton(rec: QuantLinear) -> str | None:
    why = triton_unavailable()
    if why:
        return why
    if rec.device.type != "cuda":
        return f"device {rec.device} is not CUDA"
    cap = cuda_capability(rec.device)
    if cap is None or cap < TRITON_MX_MIN_CAPABILITY:
        return f"Triton fp8 needs capability >= 8.9; this device's is {describe_capability(cap)}"
    if rec.act_quant is None:
        xv = tensor_val(rec.x)
        if xv is None or xv.dtype not in _ACT_DTYPES or xv.dim() != 2:
            return f"activation dtype {rec.compute_dtype}: the kernels take bf16/fp16 activations"
    elif rec.act_quant.scheme != "mx_block":
        return f"activation quantization {rec.act_quant.scheme} is not MX"
    if rec.compute_dtype not in _OUT_DTYPES:
        return f"output dtype {rec.compute_dtype}"
    return spec_layout_blocker(rec)


def _prefer_mx_triton(rec: QuantLinear) -> str | None:
    """AUTO: not where the tile kernel measured slower than the emulation by far.

    Weight-only MX at a static M above the decode kernels' range: the tile kernel ran 0.16-0.43x bf16 at
    M=128-4096 on sm_90, the emulation (dequantize once, bf16 matmul) 0.85-0.93x of bf16 at M=4096 (BENCHMARKS.md,
    "CUDA, mx"). A symbolic M keeps the Triton op (its decode buckets serve M <= 16, where it is 2x bf16).
    MXFP4 weights with bf16 x keep it at every M: its bf16-decode kernels (`kernels.triton.mx.bf16`, `mx.ops.pick_weight_only`'s table).
    """
    from qlower.lowerings.kernels.triton.mx.ops import (  # no Triton import: mx/ops.py imports it: read lazily
        ELEM_CODE,
        bf16_decodes,
    )

    weight_only_max, dynamic_max = crossovers.MX_WEIGHT_ONLY_TRITON_MAX_M, crossovers.MX_DYNAMIC_TRITON_MAX_M

    if rec.act_quant is None:
        if bf16_decodes(rec.compute_dtype, ELEM_CODE[rec.weight_mx.elem]):
            return None  # MXFP4 with bf16 x: the bf16-decode kernels (mx/bf16.py) at every M (its dequantize + cuBLAS above M = 64)
        if is_static(rec.m) and int(rec.m) > weight_only_max:
            return (
                f"weight-only MX with M={rec.m} > {weight_only_max} would run the tile kernel, measured at 0.16-0.43x "
                "bf16 (M=128-4096) on sm_90, below the emulation; ask for KernelPreference.TRITON to use it anyway"
            )
        return None
    if not is_static(rec.m) or int(rec.m) > dynamic_max:
        return (
            f"dynamic-activation MX with M={rec.m} > {dynamic_max} would run the fp8 tile kernel, measured at "
            "0.15x bf16 (M=4096) and 0.33x (M=128) on sm_90; ask for KernelPreference.TRITON to use it anyway"
        )
    return None


MX_TRITON = Lowering(
    name="triton.mx_linear",
    family="mx",
    kind=KernelPreference.TRITON,
    supports=supports_mx_triton,
    prefer=_prefer_mx_triton,
    emit=emit_mx_triton,
    doc="qlower Triton MX kernels: GEMV at small M, tiles above (not for dynamic MX above the GEMV range)",
)


# --------------------------------------------------------------------- mx: emulation
# How `_prefer_mx_emulated`'s reason starts (scripts/fuzz/classes.py checks report rows by it).
TRAINING_STOCK = "a training compile: stock Inductor"


def _prefer_mx_emulated(rec: QuantLinear) -> str | None:
    """AUTO: not for an MX x MX product in a training compile, where stock Inductor's own fusion of the graph's
    casts and decodes ran the step faster than qlower's emulation (49.9 against 46.8 ms a step, two
    Llama-3-8B layers of torchao's MXFP8Linear on sm_90: BENCHMARKS.md, "MX training, CUDA"), so AUTO is never
    slower than stock there. Weight-only MX in training (a frozen base under an adapter) was not measured
    against stock and keeps the emulation.

    A partial last block (K not a multiple of the block) keeps the emulation: its exact decode is what the
    backward reads (`redecode_readers`), where the graph's own spelling was miscompiled on CPU
    (tests/end_to_end/test_mx_training.py::test_partial_block_training_compiles_right).
    """
    if rec.act_quant is None or not differentiates(rec.output.graph):
        return None
    block = rec.weight_block
    if block is None or not is_static(rec.k) or int(rec.k) % block != 0:
        return None
    return (
        f"{TRAINING_STOCK}'s fused decode measured faster than qlower's MX emulation in "
        "the training step on sm_90 (BENCHMARKS.md, 'MX training, CUDA'), so the linear stays stock's; "
        "kernel_preference=EMULATED lowers it anyway"
    )


MX_EMULATED_CUDA = dataclasses.replace(MX_EMULATED, prefer=_prefer_mx_emulated)


def register() -> None:
    register_backend(
        "cuda",
        [
            WOQ_INT8_CUTLASS,
            WOQ_INT8_TRITON,
            DYNAMIC_INT8_TRITON,
            WOQ_INT8_DEQUANT_MM,
            DYNAMIC_INT8_INT_MM_CUDA,
            DYNAMIC_INT8_EMULATED,
            MX_SCALED_MM,
            MXFP4_CUTLASS,
            MX_TRITON,
            MX_EMULATED_CUDA,
        ],
        describe=describe,
        replace=True,
    )
