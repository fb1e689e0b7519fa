"""A run-time cache of oneDNN-prepacked int8 weights, for CPU compiles whose weights are not constants.

Why: with freezing, `onednn.qlinear_prepack` folds into a constant once and the u8 qlinear is 2x bf16 at M=16
and 128 (BENCHMARKS.md). Without freezing, the default for `torch.compile`, the weight is a graph input and
every `_int_mm` call re-packs it (about half the call at M=16). IPEX solves this by prepacking at
`ipex.optimize` time; qlower keeps torch.compile's contract instead: weights stay ordinary tensors and the
packed copy is a cache entry that is checked on every call.

An entry is used only while all of these hold, so a stale pack never gives a wrong number:
- the tensor object that owns the weight (`w._base` for a view, else `w`) is still alive (a weakref; the entry
  is dropped when it dies, before its id can be reused);
- its version counter is unchanged (every in-place write, `copy_` and `load_state_dict` included, bumps it);
- data pointer, shape, strides and dtype of the viewed weight are unchanged (`param.data = t` swaps storage).
Inference tensors have no version counter: they are never cached (packed per call, still correct).

Memory: one packed copy (the size of the int8 weight) per cached weight, while the weight lives.
`QLOWER_CPU_PREPACK_CACHE=0` turns the lowering off (the pass then picks `_int_mm`).
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass

import torch

ENV_SWITCH = "QLOWER_CPU_PREPACK_CACHE"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


@dataclass
class _Entry:
    owner: weakref.ref
    version: int
    geometry: tuple
    packed: torch.Tensor


def _geometry(w: torch.Tensor) -> tuple:
    return (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device)


class PrepackCache:
    """Packed weights by owning tensor and view; see the module docstring for when an entry is trusted.

    Keyed by (owner, the view's shape, strides, offset and layout flag), so several views of one storage
    (e.g. a fused weight sliced per linear) each keep their own pack instead of evicting each other.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple, _Entry] = {}
        self._watched: set[int] = set()  # owners with a finalizer that drops their entries
        self._lock = threading.Lock()
        self.packs = 0  # how many times a weight was packed (tests read it)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def packed(self, w: torch.Tensor, w_is_kn: bool = False) -> torch.Tensor:
        """The oneDNN packing of the int8 weight `w` ([N, K], or [K, N] when `w_is_kn`), packed now or taken
        from the cache."""
        if w.is_inference():
            return self._pack(w, w_is_kn)
        owner = w._base if w._base is not None else w
        key = (id(owner), tuple(w.shape), tuple(w.stride()), w.storage_offset(), w_is_kn)
        version, geometry = owner._version, _geometry(w)
        with self._lock:
            entry = self._entries.get(key)
            if (
                entry is not None
                and entry.owner() is owner
                and entry.version == version
                and entry.geometry == geometry
            ):
                return entry.packed
        packed = self._pack(w, w_is_kn)
        with self._lock:
            if id(owner) not in self._watched:
                self._watched.add(id(owner))
                weakref.finalize(owner, self._drop, id(owner))
            self._entries[key] = _Entry(weakref.ref(owner), version, geometry, packed)
        return packed

    def _drop(self, owner_id: int) -> None:
        with self._lock:
            self._watched.discard(owner_id)
            for key in [k for k in self._entries if k[0] == owner_id]:
                del self._entries[key]

    def _pack(self, w: torch.Tensor, w_is_kn: bool) -> torch.Tensor:
        self.packs += 1
        w_nk = w.t() if w_is_kn else w
        return torch.ops.onednn.qlinear_prepack(w_nk.contiguous(), None)


CACHE = PrepackCache()
