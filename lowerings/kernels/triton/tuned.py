"""Tuned config tables, loaded from data files: one JSON file per GPU under `tuned/`, next to this module.

A data file names its GPU (`"device"`, as `torch.cuda.get_device_name()` reports it), the torch / Triton versions
and dates of the sweeps behind it, how they timed, and per kernel family (`"tables"`) the command that
regenerates the table and its entries: `key` (a list of ints), `config` (the kernel config's fields, decoded by
the family's owner, e.g. `configs.config_from_fields`) and, where the tuner recorded it, `us` (the winner's
kernel time). `validate` is the schema; tests/lowerings/kernels/test_tuned_data.py checks every file.

A table answers only for the device it was measured on; any other device gets the per-bucket rules next to each
table. Off a GPU (TRITON_INTERPRET on CPU tensors) the tables of `STAND_IN` (the file marked `"stand_in": true`)
answer, so the interpreter tests run the configs the GPU runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).with_name("tuned")
SCHEMA = 1
_TOP_FIELDS = {"schema", "device", "capability", "stand_in", "torch", "triton", "date", "timing", "tables"}
_ENTRY_FIELDS = {"key", "config", "us"}


def data_files() -> list[Path]:
    return sorted(DATA_DIR.glob("*.json"))


def validate(doc: Any, where: str = "tuned data") -> dict[str, Any]:
    """`doc` (a parsed data file) if it follows the schema, else ValueError naming the first problem."""

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"{where}: {what}")

    need(isinstance(doc, dict), "not a JSON object")
    need(set(doc) <= _TOP_FIELDS, f"unknown fields {sorted(set(doc) - _TOP_FIELDS)}")
    need(doc.get("schema") == SCHEMA, f"schema is {doc.get('schema')!r}, this loader reads {SCHEMA}")
    for field in ("device", "torch", "triton", "date", "timing"):
        need(isinstance(doc.get(field), str) and bool(doc[field]), f"{field!r} must be a non-empty string")
    need(isinstance(doc.get("stand_in", False), bool), "'stand_in' must be true or false")
    need(isinstance(doc.get("tables"), dict) and bool(doc["tables"]), "'tables' must be a non-empty object")
    for family, table in doc["tables"].items():
        at = f"table {family!r}"
        need(
            isinstance(table, dict) and set(table) == {"regenerate", "entries"},
            f"{at}: needs regenerate, entries",
        )
        need(isinstance(table["regenerate"], str) and "scripts/" in table["regenerate"], f"{at}: regenerate")
        need(isinstance(table["entries"], list), f"{at}: 'entries' must be a list")
        seen: set[tuple[int, ...]] = set()
        for e in table["entries"]:
            need(isinstance(e, dict) and {"key", "config"} <= set(e) <= _ENTRY_FIELDS, f"{at}: entry {e!r}")
            key = e["key"]
            need(isinstance(key, list) and all(type(v) is int for v in key), f"{at}: key {key!r}")
            need(tuple(key) not in seen, f"{at}: key {key} twice")
            seen.add(tuple(key))
            need(isinstance(e["config"], dict), f"{at}: config of {key}")
            us = e.get("us")
            need(us is None or (isinstance(us, (int, float)) and us > 0), f"{at}: us of {key}")
    return doc


@functools.cache
def documents() -> tuple[dict[str, Any], ...]:
    """Every data file, parsed and validated (one per device)."""
    docs = tuple(validate(json.loads(p.read_text()), p.name) for p in data_files())
    devices = [d["device"] for d in docs]
    if len(set(devices)) != len(devices):
        raise ValueError(f"tuned data: a device has more than one file: {devices}")
    return docs


def _stand_in() -> str:
    marked = [d["device"] for d in documents() if d.get("stand_in")]
    if len(marked) != 1:
        raise ValueError(f"tuned data: exactly one file must be marked stand_in, found {marked}")
    return marked[0]


STAND_IN = _stand_in()  # the device whose tables answer off a GPU


def __getattr__(name: str) -> str:
    """`tuned.<STEM>`: the device named by tuned/<stem>.json (tests name a file's device this way)."""
    for path, doc in zip(data_files(), documents(), strict=True):
        if name == path.stem.upper():
            return doc["device"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class TunedTable:
    """Measured winners per key, per device name; `regenerate` re-measures them (its output lists the entries)."""

    family: str
    regenerate: str
    by_device: Mapping[str, Mapping[Hashable, Any]]

    @classmethod
    def from_files(cls, family: str, decode: Callable[[dict[str, Any]], Any]) -> TunedTable:
        """The `family` tables of every data file, each entry's config through `decode`; `regenerate` as the
        stand-in's file records it. The per-device dicts are fresh and writable."""
        by_device: dict[str, dict[Hashable, Any]] = {}
        regenerate = ""
        for doc in documents():
            table = doc["tables"].get(family)
            if table is None:
                continue
            by_device[doc["device"]] = {tuple(e["key"]): decode(e["config"]) for e in table["entries"]}
            if doc["device"] == STAND_IN or not regenerate:
                regenerate = table["regenerate"]
        return cls(family, regenerate, by_device)

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


def document(
    device: str,
    tables: Mapping[str, TunedTable],
    encode: Callable[[Any], dict[str, Any]],
    env: Mapping[str, Any],
    us: Mapping[tuple[str, tuple[int, ...]], float],
) -> dict[str, Any]:
    """The data file of `device` holding `tables` as this process has them (the tuner's output): the existing
    file's fields and timings, with `env`'s versions and date and the new timings `us` ((family, key) -> us).
    The existing file's tables of other families are kept as they are, in the file's order (a sweep of the
    int8 families leaves the `"mx"` table alone)."""
    old = next((d for d in documents() if d["device"] == device), {})
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "device": device,
        **{k: old[k] for k in ("capability", "stand_in") if k in old},
        "torch": str(env["torch"]),
        "triton": str(env["triton"]),
        "date": str(env["date"]),
        "timing": old.get(
            "timing", "GPU time per call: median of CUDA-graph replays over 8 rotating weight sets"
        ),
        "tables": {family: table for family, table in old.get("tables", {}).items() if family not in tables},
    }
    if "capability" in env and "capability" not in doc:
        doc["capability"] = "sm_{}{}".format(*env["capability"])
    order = [f for f in old.get("tables", {}) if f in tables or f in doc["tables"]]
    for family, table in tables.items():
        old_table = old.get("tables", {}).get(family, {})
        old_us = {tuple(e["key"]): e["us"] for e in old_table.get("entries", []) if "us" in e}
        entries = []
        for key, cfg in sorted(table.entries(device).items()):
            t = us.get((family, key), old_us.get(key))
            entries.append({"key": list(key), "config": encode(cfg), **({"us": t} if t is not None else {})})
        doc["tables"][family] = {
            "regenerate": old_table.get("regenerate", table.regenerate),
            "entries": entries,
        }
    rank = {f: i for i, f in enumerate(order)}
    doc["tables"] = dict(sorted(doc["tables"].items(), key=lambda kv: rank.get(kv[0], len(rank))))
    return validate(doc, f"tuned data of {device}")


def dumps(doc: Mapping[str, Any]) -> str:
    """`doc` as JSON text in the committed files' form: one entry per line."""
    head = {k: v for k, v in doc.items() if k != "tables"}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + ['  "tables": {']
    for i, (family, table) in enumerate(doc["tables"].items()):
        lines.append(f"    {json.dumps(family)}: {{")
        lines.append(f'      "regenerate": {json.dumps(table["regenerate"])},')
        lines.append('      "entries": [')
        rows = [f"        {json.dumps(e, separators=(', ', ': '))}" for e in table["entries"]]
        lines.append(",\n".join(rows))
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(doc["tables"]) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"
