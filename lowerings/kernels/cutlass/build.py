"""Find nvcc and the CUTLASS headers, and build qlower's CUTLASS library: one object per configuration,
compiled in parallel for sm_90a, linked into one shared library, cached on disk by a digest of the sources,
the configurations, the flags and the toolchain's versions.

Where things come from (first found wins):
- nvcc: `$QLOWER_NVCC`; the `nvidia-cuda-nvcc` package (the `qlower[cuda]` extra); `$CUDA_HOME/bin/nvcc`;
  `nvcc` on PATH; /usr/local/cuda/bin/nvcc.
- CUTLASS/CuTe headers: `$QLOWER_CUTLASS_INCLUDE` (folders, os.pathsep-separated); the `nvidia-cutlass`
  package's `cutlass_library/source/include` and `tools/util/include` (the extra); `$CUTLASS_PATH`.
- a library built elsewhere (`python -m qlower build --out DIR`, copied to a machine without nvcc):
  `$QLOWER_CUTLASS_LIBRARY`, used as it is.

Nothing here raises for a missing toolchain: `library()` returns the reason, which the lowering's `supports`
puts in the report, and the Triton lowerings stay in charge.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from qlower.lowerings.kernels.cpp_build import cache_root
from qlower.lowerings.kernels.cutlass.configs import MXFP4_CONFIGS, W8A16_CONFIGS, Config

CUDA_SRC = Path(__file__).resolve().parent.parent / "csrc" / "cuda"
W8A16_SOURCE = CUDA_SRC / "w8a16_sm90.cu"
MXFP4_SOURCE = CUDA_SRC / "mxfp4_sm90.cu"
# Headers of the C++ kernels the AOTInductor shims call (g++, not nvcc): outside the objects' digest.
SHIM_ONLY_HEADERS = ("cutlass_host.h",)
MXFP4_OBJECT_PREFIX = (
    "mxfp4_"  # W8A16 objects are named by their configuration alone (the AOTInductor shim links them)
)
LIBRARY_NAME = "libqlower_cutlass_sm90.so"
ARCH_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a",)  # wgmma and setmaxnreg need the `a` target
NVCC_FLAGS = (
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
    *ARCH_FLAGS,
)


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    includes: tuple[Path, ...]  # CUTLASS include/ and tools/util/include

    @functools.cached_property
    def versions(self) -> str:
        """nvcc's release line and CUTLASS's version header: part of the cache digest."""
        out = subprocess.run([str(self.nvcc), "--version"], capture_output=True, text=True, check=False)
        release = out.stdout.strip().splitlines()[-1:] or ["nvcc ?"]
        header = self.includes[0] / "cutlass" / "version.h"
        cutlass = header.read_text() if header.exists() else ""
        digest = hashlib.sha256(cutlass.encode()).hexdigest()[:12]
        return f"{release[0]}; cutlass version.h {digest}"


def _package_dirs(name: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])]


def find_nvcc() -> Path | None:
    candidates: list[Path] = []
    if os.environ.get("QLOWER_NVCC"):
        candidates.append(Path(os.environ["QLOWER_NVCC"]))
    for root in _package_dirs("nvidia"):
        candidates += [root / "cu13" / "bin" / "nvcc", root / "cuda_nvcc" / "bin" / "nvcc"]
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def find_cutlass() -> tuple[Path, ...] | None:
    options: list[tuple[Path, ...]] = []
    if os.environ.get("QLOWER_CUTLASS_INCLUDE"):
        options.append(tuple(Path(p) for p in os.environ["QLOWER_CUTLASS_INCLUDE"].split(os.pathsep) if p))
    for root in _package_dirs("cutlass_library"):
        src = root / "source"
        options.append((src / "include", src / "tools" / "util" / "include"))
    if os.environ.get("CUTLASS_PATH"):
        src = Path(os.environ["CUTLASS_PATH"])
        options.append((src / "include", src / "tools" / "util" / "include"))
    for dirs in options:
        if dirs and (dirs[0] / "cutlass" / "gemm" / "collective" / "collective_builder.hpp").exists():
            return dirs
    return None


def toolchain() -> Toolchain | str:
    """The toolchain, or why there is none (naming what to install)."""
    nvcc = find_nvcc()
    includes = find_cutlass()
    missing = []
    if nvcc is None:
        missing.append("nvcc")
    if includes is None:
        missing.append("the CUTLASS headers")
    if missing:
        return (
            f"{' and '.join(missing)} not found: `pip install 'qlower[cuda]'` brings both "
            "(or set QLOWER_NVCC / QLOWER_CUTLASS_INCLUDE)"
        )
    return Toolchain(nvcc, includes)


def _cuda_major(tc: Toolchain) -> str:
    """The CUDA major version whose runtime the process has: torch's, else the compiler's."""
    import torch

    if torch.version.cuda:
        return torch.version.cuda.split(".")[0]
    release = tc.versions.split("release ", 1)[-1]
    return release.split(".", 1)[0] if release[:1].isdigit() else "13"


def cudart_link_flags(tc: Toolchain | str | None = None) -> list[str] | str:
    """The linker flags that make a library of the objects need the CUDA runtime torch loaded: its soname
    (`libcudart.so.<major>`), from the first folder holding it (torch's `nvidia` packages, then the compiler's
    toolkit), so the loader binds it to the runtime already in the process. Or why there is none."""
    tc = toolchain() if tc is None else tc
    if isinstance(tc, str):
        return tc
    name = f"libcudart.so.{_cuda_major(tc)}"
    folders = [
        root / sub / "lib"
        for root in _package_dirs("nvidia")
        for sub in (f"cu{_cuda_major(tc)}", "cuda_runtime")
    ]
    folders += [tc.nvcc.parent.parent / "lib64", tc.nvcc.parent.parent / "lib"]
    if os.environ.get("CUDA_HOME"):
        folders.append(Path(os.environ["CUDA_HOME"]) / "lib64")
    found = next((f for f in folders if (f / name).is_file()), None)
    if found is None:
        return f"{name} not found beside torch's CUDA packages or {tc.nvcc.parent.parent}"
    return [f"-L{found}", f"-l:{name}"]


class CudaBuildError(RuntimeError):
    """nvcc failed on one of qlower's CUDA sources."""


def _define_flags(cfg: Config) -> list[str]:
    return [f"-D{k}={v}" for k, v in cfg.macros().items()]


def compile_command(tc: Toolchain, cfg: Config, out: Path, source: Path = W8A16_SOURCE) -> list[str]:
    incs = [f"-I{p}" for p in (*tc.includes, CUDA_SRC)]
    return [str(tc.nvcc), *NVCC_FLAGS, *incs, *_define_flags(cfg), "-c", str(source), "-o", str(out)]


def _digest(
    tc: Toolchain, configs: tuple[Config, ...], mxfp4_configs: tuple[Config, ...] = MXFP4_CONFIGS
) -> str:
    """Names the build folder: what nvcc reads (the .cu and .h files; not the C++ of the AOTInductor shims
    beside them, nor their host header), the flags, the configurations and the toolchain."""
    h = hashlib.sha256()
    for src in sorted(
        p for p in CUDA_SRC.iterdir() if p.suffix in (".cu", ".h") and p.name not in SHIM_ONLY_HEADERS
    ):
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    macros = ([c.macros() for c in configs], [c.macros() for c in mxfp4_configs])
    h.update(repr((NVCC_FLAGS, macros, tc.versions)).encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root().parent / "cuda"


def _compile_all(
    tc: Toolchain,
    configs: tuple[Config, ...],
    work: Path,
    jobs: int,
    mxfp4_configs: tuple[Config, ...] = (),
) -> list[Path]:
    """One object per configuration: the W8A16 source's `configs` and the MXFP4 source's `mxfp4_configs`."""
    units = [(W8A16_SOURCE, cfg, cfg.name) for cfg in configs]
    units += [(MXFP4_SOURCE, cfg, MXFP4_OBJECT_PREFIX + cfg.name) for cfg in mxfp4_configs]

    def one(unit: tuple[Path, Config, str]) -> Path:
        source, cfg, stem = unit
        obj = work / f"{stem}.o"
        proc = subprocess.run(
            compile_command(tc, cfg, obj, source), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise CudaBuildError(f"qlower: nvcc failed on {source.name} {cfg.name}:\n{proc.stderr[-6000:]}")
        return obj

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, units))


def build(
    tc: Toolchain,
    configs: tuple[Config, ...] = W8A16_CONFIGS,
    jobs: int | None = None,
    log=None,
    mxfp4_configs: tuple[Config, ...] = MXFP4_CONFIGS,
) -> Path:
    """The library for the W8A16 `configs` and the MXFP4 `mxfp4_configs`, from the cache or built now
    (`log(message)` hears the build's seconds)."""
    folder = build_dir() / f"cutlass_sm90-{_digest(tc, configs, mxfp4_configs)}"
    lib = folder / LIBRARY_NAME
    if lib.exists():
        return lib
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time per cache, across processes: concurrent first uses (pytest workers, ranks of a
    # tensor-parallel job) would each start one nvcc per configuration, gigabytes each; they wait and load.
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib
        return _build_locked(tc, configs, mxfp4_configs, folder, jobs, log)


def _build_locked(
    tc: Toolchain,
    configs: tuple[Config, ...],
    mxfp4_configs: tuple[Config, ...],
    folder: Path,
    jobs: int | None,
    log,
) -> Path:
    lib = folder / LIBRARY_NAME
    count = len(configs) + len(mxfp4_configs)
    jobs = jobs or min(count, os.cpu_count() or 1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=folder.parent) as tmp:
        work = Path(tmp) / "build"
        work.mkdir()
        objects = _compile_all(tc, configs, work, jobs, mxfp4_configs)
        link = [str(tc.nvcc), *ARCH_FLAGS, "-shared", "-cudart", "shared", *map(str, objects)]
        proc = subprocess.run([*link, "-o", str(work / LIBRARY_NAME)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CudaBuildError(f"qlower: linking {LIBRARY_NAME} failed:\n{proc.stderr[-4000:]}")
        try:
            work.rename(folder)  # atomic; a concurrent build that finished first wins
        except OSError:
            if not lib.exists():
                raise CudaBuildError(
                    f"qlower: {folder} holds no complete {LIBRARY_NAME}: delete it"
                ) from None
    if log is not None:
        log(
            f"qlower: built {LIBRARY_NAME} ({count} configurations, {jobs} jobs) in "
            f"{time.perf_counter() - start:.0f} s: {lib}"
        )
    return lib


_LOCK = threading.Lock()


def object_paths(folder: Path) -> list[Path]:
    """Every object of the library in `folder`: the W8A16 configurations' and the MXFP4 ones' (both C shims'
    kernels call into them, so a shim library linked with fewer fails to load: an undefined symbol)."""
    stems = [cfg.name for cfg in W8A16_CONFIGS] + [MXFP4_OBJECT_PREFIX + cfg.name for cfg in MXFP4_CONFIGS]
    return [folder / f"{stem}.o" for stem in stems]


def objects() -> list[Path] | str:
    """The library's objects, one per configuration (linked into AOTInductor packages with the CUTLASS op's C
    shim, lowerings/aoti/build.py), or why there are none."""
    lib = library()
    if isinstance(lib, str):
        return lib
    found = object_paths(lib.parent)
    if not all(o.is_file() for o in found):
        return (
            f"{lib.parent} holds the library without its objects (a prebuilt QLOWER_CUTLASS_LIBRARY): "
            "AOTInductor packages need nvcc and CUTLASS here (`pip install 'qlower[cuda]'`)"
        )
    cudart = cudart_link_flags()
    return f"the objects call the CUDA runtime, and {cudart}" if isinstance(cudart, str) else found


@functools.cache
def library() -> Path | str:
    """The CUTLASS library's path (prebuilt, cached, or built now, once per process), or why there is none."""
    prebuilt = os.environ.get("QLOWER_CUTLASS_LIBRARY")
    if prebuilt:
        return Path(prebuilt) if Path(prebuilt).is_file() else f"QLOWER_CUTLASS_LIBRARY={prebuilt} is no file"
    tc = toolchain()
    if isinstance(tc, str):
        return tc
    with _LOCK:
        try:
            return build(tc, log=lambda msg: print(msg, file=sys.stderr))
        except CudaBuildError as e:
            return str(e)
