"""The ABI lock: every C shim declaration qlower has ever generated, one line each, committed.

AOTInductor packages call shims by symbol, so a declaration is forever: it never changes and is never
removed. A new signature needs a new symbol: a qlower op is versioned by name (`woq_int8_mm_by_m_v2`, a new
op next to the old one), an aten op by torchgen's `_vN`. `check` reports any other change; `update` only
ever appends.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from qlower.lowerings.aoti import codegen
from qlower.lowerings.aoti import shim_ops as ops

LOCK_PATH = Path(__file__).with_name("abi.lock")
IN_TREE_DEVICES = ("cpu", "cuda", "xpu")

_HEADER = """\
# qlower AOTInductor C shim ABI lock: one line per shim, `<device> <op> v<N>: <declaration>`.
# Never edit or remove a line: compiled packages call these symbols. A new signature is a new symbol
# (qlower ops: a new op `<name>_v2`; aten ops: torchgen's `_vN`). Append with:
#   python -m qlower shims --update-lock
"""


def generate(devices: Iterable[str] = IN_TREE_DEVICES) -> dict[str, str]:
    """{lock key: declaration} of every shim qlower generates now for `devices`."""
    entries: dict[str, str] = {}
    for device in devices:
        for shim in codegen.plan(device, ops.ops_for_device(device)).shims:
            entries[shim.key] = shim.declaration
    return entries


def read(path: Path = LOCK_PATH) -> dict[str, str]:
    if not path.exists():
        return {}
    entries = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, declaration = line.partition(": ")
            entries[key] = declaration
    return entries


def _symbol(declaration: str) -> str:
    return declaration.split("(", 1)[0].split()[-1]


def check(current: dict[str, str], locked: dict[str, str], devices: Iterable[str] | None = None) -> list[str]:
    """Problems between what is generated now and the lock (empty: the ABI is intact).

    `devices` limits the check to lock lines of those devices (None: every device in `current`).
    """
    scope = set(devices) if devices is not None else {k.split()[0] for k in current}
    problems = []
    for key, declaration in locked.items():
        if key.split()[0] not in scope:
            continue
        if key not in current:
            problems.append(f"removed: {key}: compiled packages still call {_symbol(declaration)}")
        elif current[key] != declaration:
            problems.append(
                f"changed: {key}\n  locked: {declaration}\n  now:    {current[key]}\n"
                "  a shim's declaration never changes: keep the old op and add a new version (`_vN`)"
            )
    for key in current.keys() - locked.keys():
        problems.append(f"not locked: {key}: {current[key]}  (python -m qlower shims --update-lock)")
    symbols: dict[str, str] = {}
    for key, declaration in {**locked, **current}.items():
        other = symbols.setdefault(_symbol(declaration), key)
        if other != key:
            problems.append(f"clash: {key} and {other} both declare {_symbol(declaration)}")
    return problems


def update(current: dict[str, str], path: Path = LOCK_PATH) -> list[str]:
    """Append the new declarations of `current` to the lock; refuses (ValueError) if any locked one changed."""
    locked = read(path)
    devices = {k.split()[0] for k in current}
    broken = [p for p in check(current, locked, devices) if not p.startswith("not locked")]
    if broken:
        raise ValueError("qlower: the ABI lock cannot take these changes:\n" + "\n".join(broken))
    added = sorted(current.keys() - locked.keys())
    merged = {**locked, **{k: current[k] for k in added}}
    lines = [f"{k}: {merged[k]}" for k in sorted(merged)]
    path.write_text(_HEADER + "\n".join(lines) + "\n")
    return added
