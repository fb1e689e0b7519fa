"""Build a C++ library of qlower's with torch.utils.cpp_extension in a child process, cached on disk by content.

Shared by the AOTInductor libraries (lowerings/aoti/build.py: the C shims, `libqlower_ops.so`) and the in-process
native library (lowerings/kernels/native.py: `libqlower_native.so`). A child process builds, since cpp_extension
loads what it builds and `libqlower_ops.so` must never be loaded next to qlower's Python registrations; the
folder is named by the sources' digest and renamed into place once complete, so concurrent builds never see a
half-built library.
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

CSRC = Path(__file__).resolve().parent / "csrc"


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


# -fopenmp: ATen's `at::parallel_for` is an inline OpenMP loop in torch's OpenMP builds (ATen/ParallelOpenMP.h),
# serial in a library compiled without it (csrc/woq_gemm.cpp ran as fast on 2 threads as on 1). The library
# then needs libgomp.so.1, which resolves to the one torch has loaded: one thread pool, torch.set_num_threads'.
# -fmacro-prefix-map: `__FILE__` (error messages, `#include __FILE__`) names a generated source by its bare
# name, so no path of the building machine ends up in a package that links a library's archive.
_BUILD_SCRIPT = """
import json, os, subprocess, sys
import torch.utils.cpp_extension as ce
spec = json.loads(sys.argv[1])
path = ce.load(name=spec["name"], sources=spec["sources"], build_directory=spec["dir"],
               is_python_module=False, extra_cflags=["-O2", "-fopenmp", f"-fmacro-prefix-map={spec['dir']}/="],
               extra_ldflags=spec["ldflags"] + ["-fopenmp"], verbose=False)
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


def build(name: str, files: dict[str, str], extra_sources: tuple[Path, ...] = ()) -> Library:
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


NATIVE_SOURCES = ("woq_gemm.cpp",)
# qlower ops whose kernel is a C++ function of NATIVE_SOURCES named like the op (`qlower::woq_int8_gemm`):
# op -> (device, source). The C shims of that device call the function itself, compiled into the shim
# library (`#define QLOWER_KERNEL_ONLY`, nothing registered), so a package runs the kernel from its own
# wrapper: no dispatcher, and no libqlower_native.so to build where the package loads (lowerings/aoti/codegen.py).
DIRECT_KERNELS: dict[str, tuple[str, str]] = {"qlower::woq_int8_gemm": ("cpu", "woq_gemm.cpp")}


def kernel_only_sources(names: list[str]) -> dict[str, str]:
    """Generated files holding the NATIVE_SOURCES `names` as kernels alone (no op registration)."""
    return {
        f"qlower_kernel_{Path(name).stem}.cpp": "#define QLOWER_KERNEL_ONLY 1\n" + (CSRC / name).read_text()
        for name in names
    }


def native_library() -> Library:
    """libqlower_native.so: the NATIVE_SOURCES kernels under `qlower_native`, for qlower's own process.

    Each source is copied whole into one generated file after `#define QLOWER_IN_PROCESS 1` (so the digest
    covers its text, and its `#include __FILE__` re-includes the copy); the same files go into
    `ops_library()` without the define, registered there under `qlower`.
    """
    files = {
        f"qlower_native_{Path(name).stem}.cpp": "#define QLOWER_IN_PROCESS 1\n" + (CSRC / name).read_text()
        for name in NATIVE_SOURCES
    }
    return build("qlower_native", files)
