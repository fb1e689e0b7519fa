"""The backend registry: each device type declares its lowerings, ranked per family.

Device knowledge lives here and in the per-device modules, never in `patterns/`. A backend that qlower does
not ship (XPU variants, Trainium, any PrivateUse1 device) plugs in with one `register_backend` call.

Importing this module registers nothing. qlower's built-in backends (cpu, cuda, xpu: `qlower.lowerings`
hands their loader to `builtins_on_first_use`) are registered at the registry's first use, whichever function
that is: a lookup (`choose`, `backends`, `fingerprint`, `decision_env`) or a change (`register_backend`,
`unregister_backend`). So a plugin registered before any compile still ranks ahead of the built-in lowerings,
and `replace=True` or `unregister_backend` still drops them, exactly as when the built-ins loaded at import
(tests/lowerings/registry/test_registry.py,
tests/tools/test_layout.py::test_registry_registers_nothing_until_first_use).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

from qlower.lowerings.errors import UnsupportedPlatformError
from qlower.lowerings.preference import KernelPreference
from qlower.patterns.record import QuantLinear

SupportsFn = Callable[[QuantLinear], "str | None"]
EmitFn = Callable[[fx.Graph, QuantLinear, KernelPreference], fx.Node]


def _positional_params(fn: Callable) -> int | None:
    """How many positional arguments `fn` takes (None: any number, or its signature is not readable)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _taking_preference(emit: Callable) -> EmitFn:
    """`emit` as (graph, record, preference): an emitter of (graph, record) alone, as backends registered before
    emitters took the preference, is called without it."""
    count = _positional_params(emit)
    if count is None or count >= 3:
        return emit

    def call(graph: fx.Graph, record: QuantLinear, preference: KernelPreference) -> fx.Node:
        return emit(graph, record)

    call.without_preference = True  # type: ignore[attr-defined]  (tests/tools/test_layout.py)
    return call


@dataclass(frozen=True)
class Lowering:
    """One way to run a family's record on a device.

    `supports(record)` returns None when the lowering is correct for the record, else a short reason.
    `prefer(record)`, consulted only under `KernelPreference.AUTO`, returns None where the lowering is also the
    fastest choice measured, else why AUTO passes it over (an explicit preference of its kind still takes it).
    `emit(graph, record, preference)` inserts the kernel call and returns the node that replaces
    `record.output`; `preference` is the one the choice was made under (an emitter whose op also chooses at run
    time, by a symbolic M, applies AUTO's crossovers only under AUTO; the device rules hand it those numbers as
    arguments, `devices/crossovers.py`). An emitter of (graph, record) alone is called without it.
    `emits` names the aten ops ("aten::_scaled_mm_v2") the emitted graph leaves to Inductor as extern
    kernels: AOTInductor needs a C shim for each, and `python -m qlower shims` generates those the installed
    torch lacks (qlower's own ops are always shimmed).
    `available()`, where given, is asked last, only of the lowering about to be chosen: None once what it needs
    at run time exists (a library it builds at first use, say), else why not.
    `detail(record)`, where given, names what the kernel runs for this record (its path and ISA tier, say): the
    report's "why" of a chosen lowering adds it after `doc`.
    """

    name: str
    family: str
    kind: KernelPreference
    supports: SupportsFn
    emit: EmitFn
    doc: str = ""
    emits: tuple[str, ...] = ()
    prefer: SupportsFn | None = None
    detail: Callable[[QuantLinear], str] | None = None
    available: Callable[[], str | None] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "emit", _taking_preference(self.emit))


def _no_description(device: torch.device) -> str:
    return str(device)


@dataclass
class Backend:
    device_type: str
    lowerings: list[Lowering] = field(default_factory=list)
    describe: Callable[[torch.device], str] = _no_description
    env: tuple[str, ...] = ()  # environment variables its rules read: part of the pass's cache key


@dataclass(frozen=True)
class Choice:
    """The registry's answer for one record: the lowering (or None) and why the others were passed over."""

    lowering: Lowering | None
    passed_over: tuple[tuple[str, str], ...]
    reason: str | None = None


_LOCK = threading.Lock()
_BACKENDS: dict[str, Backend] = {}

# The built-in backends' loader and whether it has run. Re-entrant: the loader registers through
# `register_backend`, which asks for the built-ins first; another thread waits until they are in.
_BUILTINS_LOCK = threading.RLock()
_builtin_loader: Callable[[], None] | None = None
_builtins_state = "pending"  # "pending" -> "loading" -> "loaded"


def builtins_on_first_use(loader: Callable[[], None]) -> None:
    """Register qlower's built-in backends with `loader()` at the registry's first use (`qlower.lowerings`
    passes it; the registry imports no device module)."""
    global _builtin_loader
    with _BUILTINS_LOCK:
        _builtin_loader = loader


def ensure_builtin_backends() -> None:
    """Register the built-in backends now if no use of the registry has yet (idempotent, thread-safe)."""
    global _builtins_state
    if _builtins_state == "loaded":
        return
    with _BUILTINS_LOCK:
        if _builtins_state != "pending" or _builtin_loader is None:  # loaded, or this thread is loading them
            return
        _builtins_state = "loading"
        try:
            _builtin_loader()
        except BaseException:
            _builtins_state = "pending"  # the next use tries again, and raises again
            raise
        _builtins_state = "loaded"


def register_backend(
    device_type: str,
    lowerings: Sequence[Lowering],
    *,
    describe: Callable[[torch.device], str] | None = None,
    replace: bool = False,
    env: Sequence[str] = (),
) -> None:
    """Declare the lowerings of a device type, best first within each family.

    Registering a device type that exists already ranks the new lowerings ahead of the old ones (so a plugin
    can add a faster kernel to an in-tree backend); `replace=True` drops the old ones instead. `env` names the
    environment variables the backend's rules read, so the compile cache key covers them.
    """
    if not isinstance(device_type, str) or not device_type:
        raise ValueError("register_backend: device_type must be a device type name such as 'cpu' or 'xpu'")
    for lowering in lowerings:
        if not isinstance(lowering, Lowering):
            raise TypeError(f"register_backend: expected qlower.Lowering, got {type(lowering).__name__}")
    ensure_builtin_backends()  # a plugin's lowerings rank ahead of the built-ins, as they always have
    with _LOCK:
        old = _BACKENDS.get(device_type)
        keep = [] if (old is None or replace) else old.lowerings
        names = {lowering.name for lowering in lowerings}
        merged = list(lowerings) + [lw for lw in keep if lw.name not in names]
        describe_fn = describe or (old.describe if old is not None else _no_description)
        env_names = tuple(env) + tuple(v for v in (old.env if old and not replace else ()) if v not in env)
        _BACKENDS[device_type] = Backend(device_type, merged, describe_fn, env_names)


def unregister_backend(device_type: str) -> None:
    ensure_builtin_backends()
    with _LOCK:
        _BACKENDS.pop(device_type, None)


def backends() -> dict[str, Backend]:
    ensure_builtin_backends()
    with _LOCK:
        return dict(_BACKENDS)


def fingerprint() -> str:
    """A stable text of every registered lowering: part of the pass's cache key."""
    ensure_builtin_backends()
    with _LOCK:
        return ";".join(
            f"{dev}:" + ",".join(f"{lw.family}/{lw.name}/{lw.kind.value}" for lw in b.lowerings)
            for dev, b in sorted(_BACKENDS.items())
        )


def decision_env() -> tuple[str, ...]:
    """Every environment variable a registered backend's rules read (sorted, each once)."""
    ensure_builtin_backends()
    with _LOCK:
        return tuple(sorted({v for b in _BACKENDS.values() for v in b.env}))


def _family_lowerings(backend: Backend, family: str) -> list[Lowering]:
    return [lw for lw in backend.lowerings if lw.family == family]


def choose(record: QuantLinear, preference: KernelPreference) -> Choice:
    """Pick the lowering for `record` on its device under `preference`.

    AUTO: the first supporting lowering of the backend's ranked list, or None with the reasons. An explicit
    preference that cannot be honoured raises `UnsupportedPlatformError` naming the device, family,
    preference and the preferences that would work.
    """
    device = record.device
    backend = backends().get(device.type)
    if backend is None:
        reason = (
            f"no qlower backend registered for device type '{device.type}' (registered: {sorted(backends())})"
        )
        if preference is KernelPreference.AUTO:
            return Choice(None, (), reason)
        raise UnsupportedPlatformError(
            f"qlower: platform unsupported: device={device}, family={record.family}, "
            f"kernel_preference={preference}, shape (M, K, N)={record.shape}, dtype={record.compute_dtype}: "
            f"{reason}. Preferences that work here: AUTO (leaves it unlowered)."
        )
    family = _family_lowerings(backend, record.family)
    wanted = family if preference is KernelPreference.AUTO else [lw for lw in family if lw.kind is preference]
    passed_over: list[tuple[str, str]] = []
    for lowering in wanted:
        why = lowering.supports(record)
        if why is None and preference is KernelPreference.AUTO and lowering.prefer is not None:
            why = lowering.prefer(record)
        if why is None and lowering.available is not None:
            why = lowering.available()
        if why is None:
            return Choice(lowering, tuple(passed_over))
        passed_over.append((lowering.name, why))
    if not family:
        reason = f"device type '{device.type}' declares no {record.family} lowering"
    elif not wanted:
        reason = f"no {record.family} lowering of kind {preference} on '{device.type}'"
    else:
        reason = "; ".join(f"{name}: {why}" for name, why in passed_over)
    if preference is KernelPreference.AUTO:
        return Choice(None, tuple(passed_over), reason)
    workable = sorted({lw.kind.name for lw in family if lw.supports(record) is None})
    options = ", ".join(["AUTO"] + workable) if workable else "none (AUTO leaves it unlowered)"
    raise UnsupportedPlatformError(
        f"qlower: platform unsupported: device={backend.describe(device)}, family={record.family}, "
        f"kernel_preference={preference}, shape (M, K, N)={record.shape}, dtype={record.compute_dtype}: "
        f"{reason}. Lowerings on '{device.type}' for {record.family}: "
        f"{[f'{lw.name} ({lw.kind})' for lw in family] or 'none'}. Preferences that work here: {options}."
    )
