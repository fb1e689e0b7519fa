"""`python -m qlower shims`: write the C shims of a device, and check or extend the ABI lock.

python -m qlower shims --device xpu --out DIR                 # DIR/qlower_c_shim_xpu.{h,cpp} + custom_ops_to_c_shims.json
python -m qlower shims --device xpu --out DIR --form extend   # DIR/torch/csrc/.../extend/c_shim_xpu.h + DIR/c_shim_xpu.cpp
python -m qlower shims --check-lock                           # exit 1 if a locked declaration changed
python -m qlower shims --update-lock                          # append new declarations to the lock
python -m qlower ops-library --out DIR                        # DIR/libqlower_ops.so, to serve without qlower
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from qlower.lowerings.aoti import abi_lock, build, codegen
from qlower.lowerings.aoti import shim_ops as ops


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `shims` and `ops-library` commands."""
    _add_ops_library_parser(sub)
    p = sub.add_parser("shims", help="generate AOTInductor C shims for a device; check the ABI lock")
    p.add_argument(
        "--device", action="append", help="device type (repeatable; default for the lock: cpu, cuda, xpu)"
    )
    p.add_argument("--out", type=Path, help="folder to write the header and source into")
    p.add_argument(
        "--form", choices=codegen.FORMS, default="custom-ops", help="file layout (default custom-ops)"
    )
    p.add_argument("--op", action="append", default=[], help="extra op to shim, e.g. aten::_scaled_mm_v2")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        help="module to import first (a plugin that registers its backend and ops)",
    )
    p.add_argument("--lock", type=Path, default=abi_lock.LOCK_PATH, help="ABI lock file")
    p.add_argument("--check-lock", action="store_true", help="exit 1 when the generated ABI breaks the lock")
    p.add_argument("--update-lock", action="store_true", help="append new declarations to the lock")
    p.set_defaults(func=run)


def _add_ops_library_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ops-library", help="write libqlower_ops.so: qlower's ops in C++, to serve packages without qlower"
    )
    p.add_argument("--out", type=Path, required=True, help="folder to copy libqlower_ops.so into")
    p.set_defaults(func=run_ops_library)


def run_ops_library(args: argparse.Namespace) -> int:
    """Build (or reuse) the ops library and copy it to `--out`: it is loaded where qlower's Python is absent."""
    lib = build.ops_library()
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / lib.path.name
    shutil.copyfile(lib.path, target)
    print(f"wrote {target} (for torch {torch.__version__}; never load it next to qlower's Python ops)")
    return 0


def write(
    device: str, out: Path, form: str, extra: Sequence[str] = ()
) -> tuple[list[Path], codegen.ShimPlan]:
    """Write header and source (and, for the custom-ops form, the Inductor config table and the sources of the
    C++ kernels its shims call directly: the files of the library qlower links) for `device`."""
    custom = form == "custom-ops"
    shim_plan = codegen.plan(device, ops.ops_for_device(device, tuple(extra)), direct_kernels=custom)
    header = out / codegen.header_include(device, form)
    source = out / (f"qlower_c_shim_{device}.cpp" if custom else f"c_shim_{device}.cpp")
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(codegen.render_header(shim_plan))
    source.write_text(codegen.render_source(shim_plan, form))
    written = [header, source]
    for name, text in build.kernel_only_sources(shim_plan.kernel_sources).items():
        (out / name).write_text(text)
        written.append(out / name)
    if custom:
        table = out / f"custom_ops_to_c_shims_{device}.json"
        table.write_text(json.dumps(codegen.custom_ops_to_c_shims(shim_plan), indent=2) + "\n")
        written.append(table)
    return written, shim_plan


def run(args: argparse.Namespace) -> int:
    for module in args.imports:
        importlib.import_module(module)
    devices = args.device or list(abi_lock.IN_TREE_DEVICES)
    if args.out is None and not (args.check_lock or args.update_lock):
        print("qlower shims: give --out DIR, --check-lock or --update-lock", file=sys.stderr)
        return 2
    if args.out is not None:
        for device in devices:
            written, shim_plan = write(device, args.out, args.form, args.op)
            for shim in shim_plan.shims:
                print(f"{device}: {shim.symbol}  ({shim.op})")
            for note in shim_plan.notes:
                print(f"{device}: note: {note}")
            print("wrote " + ", ".join(str(p) for p in written))
    if args.check_lock or args.update_lock:
        current = abi_lock.generate(devices)
        if args.update_lock:
            added = abi_lock.update(current, args.lock)
            print(f"{args.lock}: {len(added)} new declaration(s)" + "".join(f"\n  {k}" for k in added))
        problems = abi_lock.check(current, abi_lock.read(args.lock), devices)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            return 1
        print(f"{args.lock}: ABI intact for {', '.join(devices)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qlower")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
