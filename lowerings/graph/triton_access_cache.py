"""One access analysis per Triton kernel configuration, not one per launch: a cache over torch's TTIR walk.

Why: torch learns which arguments a user-defined Triton kernel writes by building the kernel's TTIR and walking it
(`torch._higher_order_ops.triton_kernel_wrap.identify_accessed_tensors`; `identify_mutated_tensors` in older
torch). It does so for every launch, once when the launch is functionalized and again when Inductor lowers it,
with no cache. qlower emits a launch per linear, and for a symbolic M one per M range, all drawn from a few kernel
configurations, so a decoder's compile repeats the same analysis for every layer.

What the analysis reads (torch's `generate_ttir`): the kernel, its constexpr arguments, and the others only
through what stands in for them there (a tensor becomes a 2-element tensor of its dtype, a symbolic size the
integer 2, any other value itself). The key holds exactly that. A call passing anything else (a real tensor,
whose address alignment Triton specializes on; a host TMA descriptor) runs uncached. A hit returns a copy.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch

ANALYSES = ("identify_accessed_tensors", "identify_mutated_tensors")  # torch >= 2.12 / before
MAX_ENTRIES = 4096


class _Uncacheable(Exception):
    """An argument whose effect on the analysis the key cannot state."""


@functools.cache
def _kinds() -> tuple[tuple[type, ...], tuple[type, ...], type]:
    """(symbolic types, tensor stand-ins, Triton's dtype), resolved once: the key is built for every launch."""
    import sympy
    import triton.language as tl  # the analysis runs only for Triton kernels
    from torch._inductor.ir import TensorBox
    from torch._subclasses.fake_tensor import FakeTensor

    return (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr), (FakeTensor, TensorBox), tl.dtype


def _value_key(value: Any) -> Hashable:
    symbolic, tensors, tl_dtype = _kinds()
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return (type(value).__name__, value)
    if isinstance(value, symbolic):
        return ("symbolic",)  # torch's generate_ttir passes 2 for every one of them
    if isinstance(value, tensors):
        return ("tensor", value.dtype)
    if isinstance(value, tl_dtype):
        return ("tl.dtype", str(value))
    raise _Uncacheable(type(value).__name__)


def kernel_source(kernel: Any) -> tuple[Any, Hashable]:
    """(the JITFunction, the autotuning arguments the analysis adds). Torch wraps each launch's num_warps /
    num_stages in a one-config Autotuner of its own around the kernel's one JITFunction, and torch's analysis
    adds the first config's arguments to the call's (num_warps and num_stages do not reach the TTIR), so the
    JITFunction and those arguments are the kernel's identity."""
    extra: Hashable = ()
    if hasattr(kernel, "configs"):
        configs = kernel.configs
        extra = tuple(sorted((k, _value_key(v)) for k, v in configs[0].kwargs.items())) if configs else ()
        kernel = kernel.fn
    fn = getattr(kernel, "fn", None)
    if fn is None or not callable(fn) or hasattr(fn, "fn"):  # not a JITFunction of a plain function
        raise _Uncacheable(type(kernel).__name__)
    return kernel, extra


def configuration_key(kernel: Any, kwargs: dict[str, Any], tma_descriptor_metadata: Any) -> Hashable:
    """What torch's analysis of `kernel` with `kwargs` depends on (raises _Uncacheable where it cannot say)."""
    if tma_descriptor_metadata:
        raise _Uncacheable("host TMA descriptor")
    from torch._dynamo import config as dynamo_config

    enabled = getattr(dynamo_config, "optimize_user_defined_triton_kernels", True)
    args = tuple(sorted((name, _value_key(v)) for name, v in kwargs.items()))
    fn, extra = kernel_source(kernel)
    return (id(fn), extra, enabled, args)


def cached(analysis: Callable[..., Any]) -> Callable[..., Any]:
    """`analysis(kernel, kwargs, tma_descriptor_metadata)` run once per configuration (`configuration_key`)."""
    entries: dict[Hashable, tuple[Any, Any]] = {}

    @functools.wraps(analysis)
    def run(*args: Any, **kw: Any) -> Any:
        kernel, kwargs = args[0], args[1]
        tma = args[2] if len(args) > 2 else kw.get("tma_descriptor_metadata")
        try:
            key = (configuration_key(kernel, kwargs, tma), len(args), tuple(sorted(kw)))
        except _Uncacheable:
            return analysis(*args, **kw)
        hit = entries.get(key)
        source = kernel_source(kernel)[0]
        if hit is not None and hit[0] is source:  # the function itself: an id is never reused while held
            return copy.deepcopy(hit[1])
        result = analysis(*args, **kw)
        if len(entries) >= MAX_ENTRIES:
            entries.clear()
        entries[key] = (source, result)
        return copy.deepcopy(result)

    run._qlower_cached = True  # type: ignore[attr-defined]
    run.entries = entries  # type: ignore[attr-defined]
    return run


def install() -> None:
    """Wrap torch's analysis (whichever of `ANALYSES` this torch has) in `cached`, once. Its callers look it up
    in its module when they run, so the wrapper serves functionalization and Inductor's lowering alike."""
    from torch._higher_order_ops import triton_kernel_wrap as module

    for name in ANALYSES:
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "_qlower_cached", False):
            setattr(module, name, cached(fn))
