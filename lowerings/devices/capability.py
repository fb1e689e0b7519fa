"""CUDA compute capability of a record's device, with an override so capability rules are testable anywhere.

`supports` rules ask here instead of calling torch.cuda directly: on a machine without the GPU in question
(CI, or an SM90 box checking an SM100 lowering) tests pin the answer with `override_cuda_capability`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_OVERRIDE: list[tuple[int, int]] = []


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of `device`, the innermost override if any, None when CUDA is not available."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


@contextlib.contextmanager
def override_cuda_capability(capability: tuple[int, int]) -> Iterator[None]:
    """Pretend every CUDA device has `capability` (tests; also disable Inductor's caches meanwhile)."""
    _OVERRIDE.append(tuple(capability))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _OVERRIDE.pop()


def describe_capability(cap: tuple[int, int] | None) -> str:
    return "unknown (CUDA not available)" if cap is None else f"{cap[0]}.{cap[1]}"
