"""Build qlower's native libraries on demand with torch.utils.cpp_extension, cached by content.

- the shim library of one device: the generated C shims, as `libqlower_aoti_shims_<device>.so` and as the
  static archive `libqlower_aoti_shims_<device>.a`. AOTInductor links the archive into each package's own
  wrapper (`aot_inductor.custom_op_libs`, symbols hidden), so a package depends on no qlower file and loads
  wherever it is copied (tests/test_aoti_portable.py). The shims only call the dispatcher: they work in any
  process where qlower's ops are registered, by qlower's Python (`import qlower`) or by the ops library below.
- the ops library `libqlower_ops.so`: qlower's ops in C++ for processes without qlower's Python (C++
  deployments; `python -m qlower ops-library --out DIR` copies it out). Its schemas are generated from the
  Python registrations (the one source of truth), its kernels are `lowerings/kernels/csrc/qlower_ops.cpp`; loading it
  checks each kernel against its schema.

Both are built in a child process (cpp_extension loads what it builds, and the ops library must never be
loaded next to qlower's Python registrations of the same ops), into a temporary folder renamed into place
once complete, so concurrent builds never see a half-built library.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from qlower.lowerings.aoti import codegen
from qlower.lowerings.aoti import shim_ops as ops

CSRC = Path(__file__).resolve().parents[1] / "kernels" / "csrc"


class BuildError(RuntimeError):
    """The C++ compiler failed (or is missing): AOTInductor falls back to the proxy executor."""


def cache_root() -> Path:
    """`$QLOWER_CACHE_DIR`, else `~/.cache/qlower`; one folder per torch version below `aoti/`."""
    base = os.environ.get("QLOWER_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "qlower")
    return Path(base) / "aoti" / f"torch-{torch.__version__}"


@dataclass(frozen=True)
class Library:
    """A built shared library, its static archive next to it, and how AOTInductor links them."""

    path: Path

    @property
    def name(self) -> str:
        """The `-l` name: `libqlower_x.so` -> `qlower_x`."""
        return self.path.name.removeprefix("lib").removesuffix(".so")

    @property
    def archive(self) -> Path:
        """`lib<name>.a`: the same objects, to link into another library."""
        return self.path.with_suffix(".a")

    def custom_op_libs_entry(self) -> str:
        """The `aot_inductor.custom_op_libs` entry: link the archive into the wrapper, its symbols hidden.

        Inductor writes each entry as `-l<entry>` into a command line it splits with shlex, after the wrapper's
        objects, and offers no library-path option, so the entry carries its own `-L`. `-l:<file>` links the
        archive's members into the wrapper itself: the package needs no qlower file at load time. Hiding
        them (`--exclude-libs`) binds the wrapper's calls to its own copy, never to another package's.
        """
        folder = shlex.quote(str(self.path.parent))
        return f":{self.archive.name} -L{folder} -Wl,--exclude-libs,{self.archive.name}"


_BUILD_SCRIPT = """
import json, os, subprocess, sys
import torch.utils.cpp_extension as ce
spec = json.loads(sys.argv[1])
path = ce.load(name=spec["name"], sources=spec["sources"], build_directory=spec["dir"],
               is_python_module=False, extra_cflags=["-O2"], extra_ldflags=spec["ldflags"], verbose=False)
objects = [os.path.join(spec["dir"], os.path.splitext(os.path.basename(s))[0] + ".o") for s in spec["sources"]]
subprocess.run(["ar", "rcs", spec["archive"], *objects], check=True)
print(path)
"""


def _digest(files: dict[str, str], extra_sources: tuple[Path, ...]) -> str:
    """Names the build folder: the sources, and the recipe that builds them."""
    digest = hashlib.sha256(_BUILD_SCRIPT.encode() + b"\0")
    for fname in sorted(files):
        digest.update(fname.encode() + b"\0" + files[fname].encode() + b"\0")
    for src in extra_sources:
        digest.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _build(name: str, files: dict[str, str], extra_sources: tuple[Path, ...] = ()) -> Library:
    """Build `lib<name>.so` and `lib<name>.a` from `files` (generated sources) in a folder named by content."""
    folder = cache_root() / f"{name}-{_digest(files, extra_sources)}"
    lib = Library(folder / f"lib{name}.so")
    if lib.path.exists() and lib.archive.exists():
        return lib
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=folder.parent) as tmp:
        work = Path(tmp) / "build"
        work.mkdir()
        for fname, text in files.items():
            (work / fname).write_text(text)
        sources = [str(work / f) for f in files if f.endswith(".cpp")] + [str(s) for s in extra_sources]
        spec = {
            "name": f"lib{name}",
            "sources": sources,
            "dir": str(work),
            "archive": str(work / lib.archive.name),
            # --as-needed drops libtorch_python, which cpp_extension always adds: a C++ process has no Python.
            "ldflags": ["-Wl,--as-needed", f"-Wl,-soname,lib{name}.so"],
        }
        proc = subprocess.run(
            [sys.executable, "-c", _BUILD_SCRIPT, json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0 or not (work / lib.path.name).exists():
            raise BuildError(
                f"qlower: building {lib.path.name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        # Renaming is atomic; it fails when a concurrent build has put its (complete) folder there first.
        try:
            work.rename(folder)
        except OSError:
            if not (lib.path.exists() and lib.archive.exists()):
                raise BuildError(
                    f"qlower: {folder} holds no complete build of {lib.path.name}: delete it"
                ) from None
    return lib


def shim_library(device: str) -> Library:
    """libqlower_aoti_shims_<device>.{so,a} with the C shims of every op qlower may emit on `device`."""
    shim_plan = codegen.plan(device, ops.ops_for_device(device))
    files = {
        codegen.header_include(device, "custom-ops"): codegen.render_header(shim_plan),
        f"qlower_c_shim_{device}.cpp": codegen.render_source(shim_plan, "custom-ops"),
    }
    return _build(f"qlower_aoti_shims_{device}", files)


def render_op_definitions() -> str:
    """TORCH_LIBRARY(qlower) with every qlower op's schema, read back from the Python registrations."""
    defs = "\n".join(
        f'  m.def("{schema}");'
        for schema in (str(op.op_overload._schema).split("::", 1)[1] for op in ops.qlower_ops())
    )
    return (
        "// qlower's op schemas, generated from the Python registrations (qlower/lowerings/kernels/custom_ops.py).\n"
        "#include <torch/library.h>\n\n"
        f"TORCH_LIBRARY(qlower, m) {{\n{defs}\n}}\n"
    )


def ops_library() -> Library:
    """libqlower_ops.so: qlower's ops defined and implemented in C++ (for processes without qlower's Python)."""
    files = {"qlower_op_schemas.cpp": render_op_definitions()}
    return _build("qlower_ops", files, extra_sources=tuple(sorted(CSRC.glob("*.cpp"))))
