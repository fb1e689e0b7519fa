"""A run-time cache of oneDNN-prepacked int8 weights, for CPU compiles whose weights are not constants.

Why: with freezing, `onednn.qlinear_prepack` folds into a constant once and the u8 qlinear is 2x bf16 at M=16
and 128 (BENCHMARKS.md). Without freezing, the default for `torch.compile`, the weight is a graph input and
every `_int_mm` call re-packs it (about half the call at M=16). IPEX solves this by prepacking at
`ipex.optimize` time; qlower keeps torch.compile's contract instead: weights stay ordinary tensors and the
packed copy is a cache entry that is checked on every call.

An entry is trusted only while the weight holds the very bytes it was packed from: each entry keeps a private
copy of those int8 bytes and every call compares the weight with it (`torch.equal` on 8-byte words). Nothing
about the tensor's identity is trusted: version counters miss writes through `.data`, through numpy views or
through the storage, and pointer, shape and strides stay the same (tests/lowerings/kernels/test_cpu_prepack.py
`test_every_weight_write_between_calls_is_seen`). The lookup key (the owning tensor, `w._base` for a view,
plus the view's geometry) only finds the candidate entry; an entry is dropped when its owner dies.

Cost, at K = N = 4096 (docs/how-it-works.md, "The CPU prepack cache"): the compare reads 2 x 16 MiB, 2.4 ms of one core a
call, against 7.6 ms for the cached call at M = 16. Memory: two copies the size of the int8 weight per
cached weight (the packed one and the bytes it came from), while the weight lives.
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
    source: torch.Tensor  # a private copy of the weight `packed` was made from (same shape and strides)
    packed: torch.Tensor


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """The memory a dense 2-D tensor covers, as one flat tensor of the widest integer words that tile it
    (the compare then runs on 8x fewer elements); None when `t` does not cover one dense block."""
    if t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous():
        t = t.t()
    if not t.is_contiguous():
        return None
    flat = t.reshape(-1)
    for word in (torch.int64, torch.int32):
        try:
            return flat.view(word)
        except RuntimeError:  # size or storage offset not a multiple of the word
            continue
    return flat


def same_content(w: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether `w` holds exactly the elements of `source` (a copy with w's shape, and strides if dense)."""
    if w.shape != source.shape or w.dtype != source.dtype:
        return False
    if w.stride() == source.stride():
        a, b = _words(w), _words(source)
        if a is not None and b is not None:
            return torch.equal(a, b)
    return torch.equal(w, source)


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
        from the cache when `w` still holds the bytes the cached pack was made from."""
        owner = w._base if w._base is not None else w
        key = (id(owner), tuple(w.shape), tuple(w.stride()), w.storage_offset(), w.dtype, w_is_kn)
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None and entry.owner() is owner and same_content(w, entry.source):
            return entry.packed
        source = w.clone(memory_format=torch.preserve_format)  # pack from the copy: the pair cannot diverge
        packed = self._pack(source, w_is_kn)
        with self._lock:
            if id(owner) not in self._watched:
                self._watched.add(id(owner))
                weakref.finalize(owner, self._drop, id(owner))
            self._entries[key] = _Entry(weakref.ref(owner), source, packed)
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
