"""Tuned config tables as data: each is keyed by the name of the GPU its sweep ran on and carries the one
command that regenerates it.

A table answers only for the device it was measured on (`torch.cuda.get_device_name()`, e.g. "NVIDIA H200");
any other device gets the per-bucket rules next to each table. Off a GPU (TRITON_INTERPRET on CPU tensors) the
tables of `STAND_IN` answer, so the interpreter tests run the configs the GPU runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

H200 = "NVIDIA H200"
STAND_IN = H200  # the device whose tables answer off a GPU


@dataclass(frozen=True)
class TunedTable:
    """Measured winners per key, per device name; `regenerate` re-measures them (its output lists the entries)."""

    family: str
    regenerate: str
    by_device: Mapping[str, Mapping[Hashable, Any]]

    def entries(self, device: str | None = None) -> Mapping[Hashable, Any]:
        """The table of `device` (a name; None: the current one), empty where nothing was measured."""
        return self.by_device.get(device if device is not None else current_device_name(), {})

    def writable(self, device: str | None = None) -> dict[Hashable, Any]:
        """The table of `device` to install sweep winners into, for the rest of this process (created if new)."""
        name = device if device is not None else current_device_name()
        return self.by_device.setdefault(name, {})  # type: ignore[attr-defined]

    def get(self, key: Hashable, device: str | None = None) -> Any:
        return self.entries(device).get(key)


def current_device_name(device: Any = None) -> str:
    """The CUDA device's name (`device`: a torch.device or index; None: the current one), else `STAND_IN`."""
    import torch

    if device is not None and getattr(device, "type", "cuda") != "cuda":
        return STAND_IN
    if not torch.cuda.is_available():
        return STAND_IN
    return torch.cuda.get_device_name(device)
