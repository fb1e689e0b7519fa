"""The CPU run-time prepack cache (unfrozen dynamic-int8 weights): it is used, and it is never stale.

A stale packed weight would silently give wrong numbers, so every way PyTorch lets a user write a weight
between calls is tried (WRITES: `.data` writes, numpy views, the storage, `set_`, `load_state_dict` in place
and with `assign=True`, optimizer-style in-place updates, `no_grad` / `inference_mode` copies), plus views,
inference tensors and the weight dying.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import qlower
from qlower.lowerings.kernels.cpu_prepack import CACHE, PrepackCache
from qlower.quantize import quantize_per_row_int8
from qlower.testing import apply_pass, trace_for_inductor
from tests.forms.dynamic_int8 import AsymInt32, IntMMDivide, rewrite_and_run

FAMILY = ("dynamic_int8",)
K = N = 2048  # 4 MiB of int8: the smallest weight the cached lowering takes (CPU_CACHED_MIN_WEIGHT)
CACHED = "qlower.qlinear_u8_cached"

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
# Full-range u8 x s8 data (any real per-token quantized model): without VNNI, oneDNN's AVX2 u8s8 kernel
# saturates pairs of products past 2^15 (rel err ~0.2 on an AVX2-only EPYC), so the numbers only hold where the
# lowering is chosen without the override. The tests of the cache itself keep |q| <= 64 and run anywhere.
needs_vnni = pytest.mark.skipif(
    not torch.cpu._is_vnni_supported(), reason="oneDNN u8s8 saturates on CPUs without VNNI (full-range data)"
)


@pytest.fixture(autouse=True)
def _vnni(monkeypatch):
    """The lowering is ranked for VNNI CPUs without AMX (the CI CPU); oneDNN runs it on any x86 CPU."""
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "vnni")
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield


def _x(m: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, m, K, generator=torch.Generator().manual_seed(seed))


def _new_int8(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return quantize_per_row_int8(torch.randn(N, K, generator=g) * K**-0.5)[0]


def _assert_matches_eager(out: torch.Tensor, model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        eager = model(x)
    scale = eager.abs().max().item()
    assert (out - eager).abs().max().item() <= 1e-5 * scale
    ref = model.reference(x)
    assert (out.double() - ref).abs().max().item() <= 1.02 * (eager.double() - ref).abs().max().item() + 1e-6


# ------------------------------------------------------------------------------------------------- cache unit
def _packed_of(cache: PrepackCache, w: torch.Tensor, kn: bool = False) -> torch.Tensor:
    return cache.packed(w, kn)


def test_same_weight_packs_once_and_changes_repack():
    cache, w = PrepackCache(), _new_int8(0)
    p1 = _packed_of(cache, w)
    assert _packed_of(cache, w) is p1 and cache.packs == 1
    w.add_(0)  # an in-place write that keeps every byte: the pack is still right, and kept
    assert _packed_of(cache, w) is p1 and cache.packs == 1
    w.copy_(_new_int8(1))  # load_state_dict writes this way
    _packed_of(cache, w)
    assert cache.packs == 2
    w.data = _new_int8(2)  # same object, new storage
    _packed_of(cache, w)
    assert cache.packs == 3 and len(cache) == 1


def test_views_key_on_their_base_and_kn_layout():
    cache, w = PrepackCache(), _new_int8(0)
    kn = w.t().contiguous()
    p1 = _packed_of(cache, kn.t())  # a fresh view object each call, as Inductor's reinterpret_tensor makes
    assert _packed_of(cache, kn.t()) is p1 and cache.packs == 1
    _packed_of(cache, kn, kn=True)  # the same storage, now passed as [K, N]: other geometry, packed again
    assert cache.packs == 2


def test_views_of_one_storage_keep_their_own_packs():
    """A fused weight sliced per linear: alternating between the slices must not repack every call."""
    cache, fused = PrepackCache(), torch.cat([_new_int8(0), _new_int8(1)])
    for _ in range(3):
        _packed_of(cache, fused[:N])
        _packed_of(cache, fused[N:])
    assert cache.packs == 2 and len(cache) == 2
    fused[N:].add_(1)  # a write through one view changes that slice only: only its pack is redone
    _packed_of(cache, fused[:N])
    _packed_of(cache, fused[N:])
    assert cache.packs == 3


def test_inference_tensors_are_cached_and_their_writes_seen():
    """Inference tensors have no version counter; the content check does not need one."""
    cache = PrepackCache()
    with torch.inference_mode():
        w = _new_int8(0)
    p1 = _packed_of(cache, w)
    assert _packed_of(cache, w) is p1 and cache.packs == 1 and len(cache) == 1
    with torch.inference_mode():
        w.copy_(_new_int8(1))
    assert _packed_of(cache, w) is not p1 and cache.packs == 2


def test_entry_dies_with_its_weight():
    cache, w = PrepackCache(), _new_int8(0)
    _packed_of(cache, w)
    assert len(cache) == 1
    del w
    gc.collect()
    assert len(cache) == 0


# ------------------------------------------------------------------------------- every way to write a weight
def _delta(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """int8 d with old + d == new in int8 arithmetic (wrapping mod 256), for the in-place-add writers."""
    return (new.to(torch.int16) - old.to(torch.int16)).to(torch.int8)


def _state_dict_with(m: torch.nn.Module, new: torch.Tensor) -> dict[str, torch.Tensor]:
    return {**m.state_dict(), "q": new}


def _no_grad_copy(m: torch.nn.Module, new: torch.Tensor) -> None:
    with torch.no_grad():
        m.q.copy_(new)


def _inference_mode_copy(m: torch.nn.Module, new: torch.Tensor) -> None:
    with torch.inference_mode():
        m.q.copy_(new)


def _optimizer_add(m: torch.nn.Module, new: torch.Tensor) -> None:
    with torch.no_grad():  # torch.optim's single-tensor step: p.add_(update)
        m.q.add_(_delta(m.q, new))


def _set_data(m: torch.nn.Module, new: torch.Tensor) -> None:
    m.q.data = new.clone()


# Each writer leaves m.q == new by a different route. The version counter of m.q misses the `.data`, numpy and
# storage writes; `set_`, `.data =` and `assign=True` keep (or reuse) shape and strides.
WRITES = {
    "from_numpy(arr) weight, arr[:] = new": lambda m, new: m.arr.__setitem__(slice(None), new.numpy()),
    "w.data.copy_(new)": lambda m, new: m.q.data.copy_(new),
    "w.data[:] = new": lambda m, new: m.q.data.__setitem__(slice(None), new),
    "w.numpy()[:] = new": lambda m, new: m.q.numpy().__setitem__(slice(None), new.numpy()),
    "w.untyped_storage().copy_(...)": lambda m, new: m.q.untyped_storage().copy_(
        new.contiguous().untyped_storage()
    ),
    "w.detach().copy_(new)": lambda m, new: m.q.detach().copy_(new),
    "no_grad: w.copy_(new)": _no_grad_copy,
    "inference_mode: w.copy_(new)": _inference_mode_copy,
    "optimizer step: w.add_(d)": _optimizer_add,
    "foreach optimizer step: _foreach_add_": lambda m, new: torch._foreach_add_([m.q], [_delta(m.q, new)]),
    "w.set_(new)": lambda m, new: m.q.set_(new.clone()),
    "w.data = new": _set_data,
    "load_state_dict (in place)": lambda m, new: m.load_state_dict(_state_dict_with(m, new)),
    "load_state_dict(assign=True)": lambda m, new: m.load_state_dict(
        _state_dict_with(m, new.clone()), assign=True
    ),
}


class _NumpyBacked(torch.nn.Module):
    """An int8 weight buffer that is a view of a numpy array (`torch.from_numpy`), [N, K] or stored [K, N]."""

    def __init__(self, q: torch.Tensor, kn: bool) -> None:
        super().__init__()
        self.arr = (q.t() if kn else q).contiguous().numpy().copy()
        self.register_buffer("q", torch.from_numpy(self.arr))
        self.kn = kn

    def q_nk(self) -> torch.Tensor:
        return self.q.t() if self.kn else self.q


def _cached_op_matches(m: _NumpyBacked, x_u8: torch.Tensor, scale: torch.Tensor) -> None:
    out = torch.ops.qlower.qlinear_u8_cached(x_u8, m.q, scale, m.kn)
    ref = (x_u8.double() - 128) @ m.q_nk().double().t() * scale.double()
    err = (out.double() - ref).abs().max().item()
    assert err <= 1e-5 * ref.abs().max().item(), f"stale pack: max err {err:.3g} of {ref.abs().max():.3g}"


@pytest.mark.parametrize("kn", [False, True], ids=["nk", "kn"])
@pytest.mark.parametrize("write", list(WRITES))
def test_every_weight_write_between_calls_is_seen(write, kn):
    """The cached op after each write API matches float64 math on the new weight, and repacks only once."""
    k, n = 256, 192
    g = torch.Generator().manual_seed(3)
    # Ranges where no pair of u8 * s8 products passes 2^15: without VNNI (this test forces the VNNI choice),
    # oneDNN's AVX2 u8s8 kernel saturates such pairs, which would hide the staleness this test looks for.
    old, new = (torch.randint(-100, 101, (n, k), dtype=torch.int8, generator=g) for _ in range(2))
    m = _NumpyBacked(old, kn)
    x_u8 = torch.randint(100, 157, (7, k), dtype=torch.uint8, generator=g)
    scale = torch.rand(n, generator=g) / 64 + 1e-3
    _cached_op_matches(m, x_u8, scale)
    packs = CACHE.packs
    _cached_op_matches(m, x_u8, scale)
    assert CACHE.packs == packs  # unchanged weight: served from the cache
    WRITES[write](m, new.t() if kn else new)
    assert torch.equal(m.q_nk(), new)  # the write did what it says
    _cached_op_matches(m, x_u8, scale)
    _cached_op_matches(m, x_u8, scale)
    assert CACHE.packs == packs + 1  # packed again once, then served from the cache again


def _small_int8(seed: int) -> torch.Tensor:
    """|q| <= 64: no u8 * s8 product pair passes 2^15 for any u8 activation (see the test above)."""
    return torch.randint(-64, 65, (N, K), dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def test_compiled_model_sees_every_weight_write():
    """The same writes through a compiled model (the cached lowering), one after another, against eager."""
    model, x = IntMMDivide(K, N), _x()
    m = _NumpyBacked(_small_int8(99), kn=False)
    model.arr = m.arr
    model.register_buffer("q", m.q)
    fn = torch.compile(model, options=qlower.inductor_options(families=FAMILY))
    with torch.no_grad():
        _assert_matches_eager(fn(x), model, x)
        assert [d.lowering for d in qlower.last_report()] == [CACHED]
        for i, (name, write) in enumerate(WRITES.items()):
            packs = CACHE.packs
            write(model, _small_int8(100 + i))
            assert torch.equal(model.q, _small_int8(100 + i)), name
            _assert_matches_eager(fn(x), model, x)
            _assert_matches_eager(fn(x), model, x)
            assert CACHE.packs - packs == 1, name


# --------------------------------------------------------------------------------------- through the pass
@needs_vnni
def test_chosen_without_freezing_and_follows_weight_updates():
    model, x = IntMMDivide(K, N), _x()
    CACHE.clear()
    packs = CACHE.packs
    out, report = rewrite_and_run(model, x, families=FAMILY)
    assert [d.lowering for d in report] == [CACHED], report
    _assert_matches_eager(out, model, x)
    fn = torch.compile(model, backend="inductor", options=qlower.inductor_options(families=FAMILY))
    with torch.no_grad():
        out, (code,) = run_and_get_code(fn, x)
        assert "torch.ops.qlower.qlinear_u8_cached.default(" in code
        _assert_matches_eager(out, model, x)
        _assert_matches_eager(fn(_x(seed=2)), model, _x(seed=2))
        assert (
            CACHE.packs - packs == 1
        )  # the traced run and the compiled model pass the same buffer: one pack
        model.q.copy_(_new_int8(7))  # new weights in place: the next call must see them
        _assert_matches_eager(fn(x), model, x)
        assert CACHE.packs - packs == 2


def test_not_chosen_for_small_weights_zero_points_or_aot():
    _, report = rewrite_and_run(IntMMDivide(1024, 1024), torch.randn(17, 1024), families=FAMILY)
    (d,) = report
    assert d.lowering != CACHED and "< 2^22" in d.passed_over_text
    _, report = rewrite_and_run(AsymInt32(K, N), _x(), families=FAMILY)
    (d,) = report
    assert d.lowering == "aten._int_mm" and "zero points" in d.passed_over_text  # _int_mm compensates them
    from torch._inductor.virtualized import V

    gm = trace_for_inductor(IntMMDivide(K, N), _x())
    with V.set_aot_compilation(True):
        report = apply_pass(gm, families=FAMILY)
    (d,) = report
    assert d.lowering == "aten._int_mm" and "AOTInductor" in d.passed_over_text


def test_switch_off(monkeypatch):
    monkeypatch.setenv("QLOWER_CPU_PREPACK_CACHE", "0")
    _, report = rewrite_and_run(IntMMDivide(K, N), _x(), families=FAMILY)
    (d,) = report
    assert d.lowering == "aten._int_mm" and "QLOWER_CPU_PREPACK_CACHE=0" in d.passed_over_text


@needs_vnni
def test_torchao_model_packs_once_and_matches_float64():
    """A real producer: torchao's Int8DynamicActivationInt8WeightConfig. Its int8 data is a tensor-subclass
    field, flattened into a graph input: the same tensor on every call, so one pack serves them all."""
    from tests.forms.dynamic_int8 import torchao_linear

    model = torchao_linear(K, N, bias=True)
    CACHE.clear()
    packs = CACHE.packs
    fn = torch.compile(model, options=qlower.inductor_options(families=FAMILY))
    with torch.no_grad():
        for seed in (1, 2, 3):
            x = _x(seed=seed).to(torch.bfloat16)
            out, eager = fn(x), model(x)
            w = model[0].weight
            ref = (
                x.double() @ (w.qdata.double() * w.scale.double().reshape(-1, 1)).t() + model[0].bias.double()
            )
            err, eager_err = (out.double() - ref).abs().max(), (eager.double() - ref).abs().max()
            assert err <= 1.05 * eager_err, (err, eager_err)
    assert [d.lowering for d in qlower.last_report()] == [CACHED]
    assert CACHE.packs - packs == 1


class _FusedHalves(torch.nn.Module):
    """Two dynamic-int8 linears whose weights are the halves of one fused [2N, K] int8 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("q", torch.cat([_new_int8(0), _new_int8(1)]))
        self.register_buffer("s", torch.rand(2 * N) / 64 + 1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from tests.forms.dynamic_int8 import per_token

        xq, sx = per_token(x.reshape(-1, K))
        a = torch._int_mm(xq, self.q[:N].t()) * sx * self.s[:N]
        b = torch._int_mm(xq, self.q[N:].t()) * sx * self.s[N:]
        return a + b

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        w = self.q.double() * self.s.double()[:, None]
        x2 = x.reshape(-1, K).double()
        return x2 @ w[:N].t() + x2 @ w[N:].t()


def test_slices_of_a_fused_weight_are_not_cached():
    """Inductor passes a slice of a graph input as `reinterpret_tensor`: a new tensor every call, without the
    input's version counter, so an in-place write could not be seen. Such weights keep `_int_mm`."""
    model, x = _FusedHalves(), _x()
    CACHE.clear()
    packs = CACHE.packs
    fn = torch.compile(model, options=qlower.inductor_options(families=FAMILY))
    with torch.no_grad():
        for seed in (1, 2):
            x = _x(seed=seed)
            out, eager, ref = fn(x), model(x), model.reference(x)
            assert (out.double() - ref).abs().max() <= 1.02 * (eager.double() - ref).abs().max() + 1e-6
    decisions = qlower.last_report()
    assert [d.lowering for d in decisions] == ["aten._int_mm", "aten._int_mm"]
    assert all("a view or computed" in d.passed_over_text for d in decisions)
    assert CACHE.packs == packs


@needs_vnni
def test_dynamic_m_including_zero_and_one():
    """Dynamic M is served by the cached qlinear; Dynamo specializes M = 0 and 1, which recompile (M = 1: the
    `_int_mm` GEMV). Every call matches eager."""
    model = IntMMDivide(K, N)
    fn = torch.compile(model, options=qlower.inductor_options(families=FAMILY), dynamic=True)
    with torch.no_grad():
        for i, m in enumerate((5, 9, 1, 0, 7)):
            x = _x(m=m, seed=m)
            out = fn(x)
            assert out.shape == (2, m, N)
            if m:
                _assert_matches_eager(out, model, x)
            if i == 0:
                (d,) = qlower.last_report()
                assert d.lowering == CACHED and not isinstance(d.shape[0], int), d
