"""The knobs of qlower's Triton and CUTLASS kernels, for the sweeps that choose their committed tables.

`scripts/tune_cuda_kernels.py --sweep` times `gemv`/`mm` configs of the int8 kernels and writes the data file
(lowerings/kernels/triton/tuned/<gpu>.json) whose winners `WOQ_INT8_TUNED` / `DYNAMIC_INT8_TUNED` hold for the
device it ran on (tables keyed by device name, each with its `regenerate` command); `scripts/bench_mx.py
--sweep` does the same for the MX kernels (`MX_DECODE_TUNED`).
Importing this module imports Triton.
"""

from __future__ import annotations

from typing import Any

from qlower.lowerings.kernels.cutlass import build as _cutlass_build
from qlower.lowerings.kernels.cutlass import configs as _cutlass_configs
from qlower.lowerings.kernels.cutlass import w8a16 as _cutlass_w8a16
from qlower.lowerings.kernels.triton import configs as _configs
from qlower.lowerings.kernels.triton import tuned as _tuned
from qlower.lowerings.kernels.triton.int8 import ops as _int8_ops
from qlower.lowerings.kernels.triton.mx import ops as _mx_ops

# int8 kernels (woq_int8, dynamic_int8): config constructors, the tables, the rules, one-config launches
gemv = _configs.gemv
mm = _configs.mm
tma = _configs.tma
decode_fma = _configs.decode_fma
decode_dot = _configs.decode_dot
m_bucket = _configs.m_bucket
woq_int8_config = _configs.woq_int8_config
dynamic_int8_config = _configs.dynamic_int8_config
WOQ_INT8_TUNED = _configs.WOQ_INT8_TUNED
DYNAMIC_INT8_TUNED = _configs.DYNAMIC_INT8_TUNED
WOQ_INT8_TABLE = _configs.WOQ_INT8_TABLE  # the stand-in device's entries of the two above
DYNAMIC_INT8_TABLE = _configs.DYNAMIC_INT8_TABLE
dynamic_plan = _configs.dynamic_plan
# the data files behind the tables (one per GPU): what `tune_cuda_kernels.py --sweep` writes
tuned_document = _tuned.document
dump_tuned = _tuned.dumps
launch_int8_as_dynamic = _int8_ops.launch_as_dynamic
launch_int8_config = _int8_ops.launch_config
launch_woq_dequant_mm = _int8_ops._dense  # dequant + cuBLAS: AUTO's route above the int8 kernels' range

# CUTLASS W8A16 GEMM (sm_90a): the library, its configurations, one-configuration launches
# (`scripts/tune_cutlass.py` writes lowerings/kernels/cutlass/tuned/<gpu>.json)
cutlass_library = _cutlass_build.library
CUTLASS_W8A16_CONFIGS = _cutlass_configs.W8A16_CONFIGS
CutlassChoice = _cutlass_configs.Choice
launch_cutlass_w8a16 = _cutlass_w8a16.launch

# MX kernels
MXConfig = _mx_ops.MXConfig
MX_ELEM_CODE = _mx_ops.ELEM_CODE
launch_mx_config = _mx_ops.launch_config
MX_DECODE_TUNED = _mx_ops.DECODE_TUNED
pick_mx_config = _mx_ops.pick_config


def set_mx_default(name: str, cfg: Any) -> None:
    """Make `cfg` the MX default config `name` (e.g. "GEMV_FP4") for the rest of this process."""
    if not hasattr(_mx_ops, name):
        raise ValueError(f"qlower.tuning: no MX default config named {name!r}")
    setattr(_mx_ops, name, cfg)


__all__ = [
    "CUTLASS_W8A16_CONFIGS",
    "CutlassChoice",
    "DYNAMIC_INT8_TABLE",
    "DYNAMIC_INT8_TUNED",
    "MXConfig",
    "MX_DECODE_TUNED",
    "MX_ELEM_CODE",
    "WOQ_INT8_TABLE",
    "WOQ_INT8_TUNED",
    "decode_dot",
    "decode_fma",
    "dynamic_int8_config",
    "dump_tuned",
    "dynamic_plan",
    "gemv",
    "cutlass_library",
    "launch_cutlass_w8a16",
    "launch_int8_as_dynamic",
    "launch_int8_config",
    "launch_mx_config",
    "launch_woq_dequant_mm",
    "m_bucket",
    "mm",
    "pick_mx_config",
    "set_mx_default",
    "tuned_document",
    "woq_int8_config",
]


def triton_kernel_names() -> frozenset[str]:
    """Names of qlower's Triton kernels (the `triton.jit` functions under lowerings/kernels/triton, its family folders included), as a profiler
    names their launches (`scripts/bench_model.py --kernel-split`)."""
    import importlib
    import pkgutil

    import triton

    from qlower.lowerings.kernels import triton as qtriton

    names = set()
    for info in pkgutil.walk_packages(qtriton.__path__, prefix=f"{qtriton.__name__}."):  # int8/, mx/ too
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            while not isinstance(obj, triton.JITFunction) and hasattr(obj, "fn"):  # autotuned, heuristics
                obj = obj.fn
            if isinstance(obj, triton.JITFunction):
                names.add(obj.__name__)
    return frozenset(names)
