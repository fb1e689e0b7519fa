"""GPU diagnosis: AOTInductor export of qlower's Triton kernels (and baselines), one subprocess per case.

    python -m pip install -q --no-deps --no-build-isolation . && python -P scripts/gpu_exp_aoti.py [CASE ...]

Each case runs in its own process (faulthandler on), so a segfault is recorded with the last stage reached:
build -> eager -> export -> compile -> inspect -> load -> run -> match (-> ok). After `compile` the child
reports, before anything is launched from the package: qlower's report, the proxy-executor call count, the
launch parameters Inductor recorded per Triton kernel (CudaKernelParamCache: call_args, constants, scratch
args, shared memory, warps) and, per kernel, the number of `kernel_args_` the C++ wrapper passes against the
number of parameters the cubin declares (cuFuncGetParamInfo): a wrapper passing fewer than the cubin takes
makes cuLaunchKernel read past the array (host segfault).

Writes $OUT/aoti_exp.json (one entry per case) and $OUT/aoti_exp.log (per case: stages, info, output tail),
plus the generated `<case>.wrapper.cpp` of failing cases (and of the reference woq case), at most 6.
Environment: OUT (default ./out), QLOWER_EXP_BUDGET (seconds, default 285), QLOWER_EXP_JOBS (default 4).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # module level: Triton resolves `tl` from the kernel's globals
    import triton
    import triton.language as tl
except ImportError:  # the parent only needs it in the children
    triton = None

if triton is not None:

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask
        )

    @triton.jit
    def add_stride_kernel(x_ptr, y_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs * stride, mask=mask)
        tl.store(out_ptr + offs * stride, x + tl.load(y_ptr + offs * stride, mask=mask), mask=mask)


REPO = Path(__file__).resolve().parents[1]
DEV = os.environ.get("QLOWER_EXP_DEVICE", "cuda")  # "cpu": a local dry run of the plumbing
PROXY = "aoti_torch_proxy_executor_call_function"
STAGES = ("start", "build", "eager", "export", "compile", "inspect", "load", "run", "match", "ok")
MAX_WRAPPERS = 6
LOG_TAIL = 200_000
LOG_TAIL_BIG = 3_000_000  # the TORCH_LOGS=output_code case


@dataclass(frozen=True)
class Case:
    """One experiment: a model builder name, its arguments, and the compile settings."""

    name: str
    doc: str
    model: str  # key of BUILDERS
    margs: dict[str, Any] = field(default_factory=dict)
    qlower: bool = True  # compile with qlower.inductor_options()
    pref: str = "AUTO"
    configs: dict[str, Any] = field(default_factory=dict)  # extra Inductor config entries
    env: dict[str, str] = field(default_factory=dict)
    dynamic: bool = False  # dynamic batch dim via torch.export.Dim
    patch: str | None = None  # key of PATCHES, applied in the child before export
    dump: bool = False  # always dump the wrapper .cpp


WOQ17 = {"k": 1000, "n": 520, "m": 17, "bias": True}  # the skipped test's shapes (mm 64x64x128, 4 stages)
CASES: tuple[Case, ...] = (
    Case("a_plain_bf16", "baseline: bf16 linear+relu+linear, no qlower", "plain", {"m": 17}, qlower=False),
    Case(
        "b_triton_op_add",
        "triton_op add kernel (no qlower), BLOCK constexpr only",
        "add",
        {"m": 17},
        qlower=False,
    ),
    Case(
        "c_woq_auto_m17", "woq_int8 AUTO M=17 (the skipped test): qlinear_mm_kernel", "woq", WOQ17, dump=True
    ),
    Case("d_woq_aten_m17", "woq_int8 kernel_preference=aten (no Triton op)", "woq", WOQ17, pref="ATEN"),
    Case(
        "b2_triton_op_add_stride1",
        "triton_op add with an int arg == 1 (equal_to_1 -> constexpr)",
        "add",
        {"m": 17, "stride": True},
        qlower=False,
    ),
    Case(
        "c2_woq_m17_small_smem",
        "woq M=17 with mm 16x32x64 w4 s1 (shared mem << 48 KB)",
        "woq",
        WOQ17,
        patch="small_config",
    ),
    Case("c3_woq_m1_gemv", "woq M=1: woq_int8_gemv_kernel", "woq", {**WOQ17, "m": 1}),
    Case(
        "c4_woq_m17_embed",
        "woq M=17, aot_inductor.embed_kernel_binary=True",
        "woq",
        WOQ17,
        configs={"aot_inductor.embed_kernel_binary": True},
    ),
    Case(
        "c5_woq_m17_no_ct_autotune",
        "woq M=17, triton.autotune_at_compile_time=False",
        "woq",
        WOQ17,
        configs={"triton.autotune_at_compile_time": False},
    ),
    Case("e_dyn_int8_m17", "dynamic_int8 MLP (1024->512->256) M=17 AUTO", "dyn_int8", {"m": 17}),
    Case("f1_mx_w4_m1", "weight-only MXFP4 M=1 (mx_gemv_kernel)", "mx", {"m": 1, "a": None, "w": "e2m1"}),
    Case("f2_mx_dyn8_m2", "dynamic MXFP8 M=2 (mx_gemv_kernel)", "mx", {"m": 2, "a": "e4m3", "w": "e4m3"}),
    Case(
        "g1_woq_dim_auto",
        "woq dynamic batch (Dim) AUTO (declines Triton: dynamic M)",
        "woq",
        {**WOQ17, "m": 4},
        dynamic=True,
    ),
    Case(
        "g2_woq_dim_triton",
        "woq dynamic batch (Dim) TRITON: gated grids, SymInt arithmetic",
        "woq",
        {**WOQ17, "m": 4},
        dynamic=True,
        pref="TRITON",
    ),
    Case(
        "g3_add_dim",
        "triton_op add, dynamic batch (Dim): SymInt grid, no qlower",
        "add",
        {"m": 4},
        qlower=False,
        dynamic=True,
    ),
    Case(
        "c9_woq_m17_output_code",
        "woq M=17 with TORCH_LOGS=output_code (wrapper code in the log)",
        "woq",
        WOQ17,
        env={"TORCH_LOGS": "output_code"},
    ),
    Case(
        "c6_woq_m17_even_k",
        "woq M=17, K=1024 N=512 (EVEN_K, no bias)",
        "woq",
        {"k": 1024, "n": 512, "m": 17, "bias": False},
    ),
    Case(
        "c7_woq_m17_debug_compile",
        "woq M=17, aot_inductor.debug_compile=True",
        "woq",
        WOQ17,
        configs={"aot_inductor.debug_compile": True},
    ),
    Case(
        "c8_woq_m17_compile_threads1",
        "woq M=17, compile_threads=1 (no compile worker pool)",
        "woq",
        WOQ17,
        configs={"compile_threads": 1},
    ),
    Case(
        "g4_dyn_int8_dim_triton",
        "dynamic_int8 dynamic batch TRITON",
        "dyn_int8",
        {"m": 4},
        dynamic=True,
        pref="TRITON",
    ),
    Case(
        "g5_plain_dim",
        "baseline bf16 MLP, dynamic batch (Dim), no qlower",
        "plain",
        {"m": 4},
        qlower=False,
        dynamic=True,
    ),
    Case(
        "f3_mx_w4_m37_triton",
        "weight-only MXFP4 M=37 TRITON (mx_mm_kernel)",
        "mx",
        {"m": 37, "a": None, "w": "e2m1"},
        pref="TRITON",
    ),
)
BY_NAME = {c.name: c for c in CASES}
DYN_SIZES = (1, 5, 70)


# ----------------------------------------------------------------------------------------------- child side


def _emit(tag: str, payload: Any) -> None:
    """A marker line the parent parses (stdout, flushed: survives a crash right after)."""
    print(f"@@{tag} {json.dumps(payload, default=str)}", flush=True)


def _stage(name: str) -> None:
    sys.stderr.flush()
    _emit("STAGE", name)


def _build_plain(m: int) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = (
        nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(torch.bfloat16).to(DEV).eval()
    )
    return model, (torch.randn(m, 256, device=DEV, dtype=torch.bfloat16),)


def _register_add_ops() -> None:
    """`qlower_exp::add` (BLOCK constexpr only) and `qlower_exp::add_stride` (plus an int stride arg, 1 here)."""
    import torch
    from torch.library import triton_op, wrap_triton

    def add(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(add_kernel)[((n + 255) // 256,)](x, y, out, n, BLOCK=256)
        return out

    def add_stride(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(add_stride_kernel)[((n + 255) // 256,)](x, y, out, n, 1, BLOCK=256)
        return out

    for name, fn in (("add", add), ("add_stride", add_stride)):
        # live annotations: this module has `from __future__ import annotations`, triton_op reads them
        fn.__annotations__ = {"x": torch.Tensor, "y": torch.Tensor, "return": torch.Tensor}
        triton_op(f"qlower_exp::{name}", mutates_args=())(fn)


def _build_add(m: int, stride: bool = False) -> tuple[Any, tuple[Any, ...]]:
    import torch

    _register_add_ops()
    op = torch.ops.qlower_exp.add_stride if stride else torch.ops.qlower_exp.add

    class AddModel(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return op(x.reshape(-1), (x * 2).reshape(-1)).reshape(x.shape).relu()

    return AddModel().to(DEV), (torch.randn(m, 256, device=DEV, dtype=torch.bfloat16),)


def _build_woq(m: int, k: int, n: int, bias: bool) -> tuple[Any, tuple[Any, ...]]:
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from woq_models import WoqLinear

    model = WoqLinear(k, n, torch.bfloat16, bias=bias).to(DEV)
    return model, (torch.randn(m, k, device=DEV, dtype=torch.bfloat16),)


def _build_dyn_int8(m: int) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    from qlower.quantize import QUANTIZERS

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 256)).to(torch.bfloat16)
    assert QUANTIZERS["dynamic_int8"](model) == 2
    return model.to(DEV).eval(), (torch.randn(m, 1024, device=DEV, dtype=torch.bfloat16),)


def _build_mx(m: int, a: str | None, w: str, n: int = 256, k: int = 512) -> tuple[Any, tuple[Any, ...]]:
    """The hand-written MX linear of tests/test_mx_gpu.py (weights as buffers)."""
    import torch
    import torch.nn.functional as F

    from qlower.patterns import mx_format as fmt

    class MXLinear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            g = torch.Generator(device=DEV).manual_seed(3)
            q, e = fmt.quantize(torch.randn(n, k, device=DEV, generator=g) * k**-0.5, w)
            self.register_buffer("q", q)
            self.register_buffer("e", e)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x2 = x
            if a is not None:
                xq, xe = fmt.quantize(x.float(), a)
                x2 = fmt.dequantize(xq, xe, a, x.dtype)
            return F.linear(x2, fmt.dequantize(self.q, self.e, w, x.dtype))

    return MXLinear(), (torch.randn(m, k, device=DEV, dtype=torch.bfloat16),)


BUILDERS: dict[str, Callable[..., tuple[Any, tuple[Any, ...]]]] = {
    "plain": _build_plain,
    "add": _build_add,
    "woq": _build_woq,
    "dyn_int8": _build_dyn_int8,
    "mx": _build_mx,
}


def _patch_small_config() -> None:
    """Every static-M woq config becomes mm 16x32x64, 4 warps, 1 stage (a few KB of shared memory)."""
    from qlower.lowerings.triton_kernels import configs

    small = configs.mm(16, 32, 64, 4, 1)
    configs.woq_int8_config = lambda m, k, n: small  # ops.py looks the function up at trace time


PATCHES: dict[str, Callable[[], None]] = {"small_config": _patch_small_config}

_RECORDED: dict[str, dict[str, Any]] = {}


def _record_param_cache() -> None:
    """Wrap CudaKernelParamCache.set to keep what Inductor records for each kernel's C++ launch."""
    from torch._inductor.codecache import CudaKernelParamCache

    orig = CudaKernelParamCache.set.__func__

    def set_(cls: Any, key: str, params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        tm = params.get("triton_meta") or {}
        _RECORDED[key] = {
            "mangled_name": params.get("mangled_name"),
            "num_warps": params.get("num_warps"),
            "shared_mem": params.get("shared_mem"),
            "def_args": params.get("def_args"),
            "call_args": params.get("call_args"),
            "global_scratch": params.get("global_scratch", "<absent>"),
            "profile_scratch": params.get("profile_scratch", "<absent>"),
            "config": params.get("config"),
            "signature": {str(k): str(v) for k, v in (tm.get("signature") or {}).items()},
            "constants": {str(k): repr(v) for k, v in (tm.get("constants") or {}).items()},
            "grid_type": (params.get("inductor_meta") or {}).get("grid_type"),
        }
        return orig(cls, key, params, *args, **kwargs)

    CudaKernelParamCache.set = classmethod(set_)


def _cubin_params(data: bytes, name: str) -> list[int] | str:
    """Parameter sizes of `name` in a cubin, through the driver (needs CUDA >= 12.4 for cuFuncGetParamInfo)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    if not hasattr(cuda, "cuFuncGetParamInfo"):
        return "driver has no cuFuncGetParamInfo"
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    buf = ctypes.create_string_buffer(data, len(data) + 1)
    rc = cuda.cuModuleLoadData(ctypes.byref(mod), buf)
    if rc:
        return f"cuModuleLoadData error {rc}"
    try:
        rc = cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode())
        if rc:
            return f"cuModuleGetFunction error {rc}"
        sizes: list[int] = []
        off, size = ctypes.c_size_t(), ctypes.c_size_t()
        while len(sizes) < 512:
            if cuda.cuFuncGetParamInfo(
                fn, ctypes.c_size_t(len(sizes)), ctypes.byref(off), ctypes.byref(size)
            ):
                break
            sizes.append(size.value)
        return sizes
    finally:
        cuda.cuModuleUnload(mod)


def _split_calls(src: str) -> dict[str, str]:
    """{kernel name: source of its `call_<kernel>` launcher} in a generated wrapper."""
    parts = re.split(r"static inline void call_(\w+)\(", src)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _inspect(path: str) -> dict[str, Any]:
    """What the package will launch, checked before loading it: see the module docstring."""
    from torch._inductor.codecache import CudaKernelParamCache

    info: dict[str, Any] = {}
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        info["files"] = names[:60]
        wrappers = [n for n in names if n.endswith(".wrapper.cpp")]
        src = "".join(z.read(n).decode(errors="ignore") for n in wrappers)
        blobs = {Path(n).name: n for n in names if n.endswith((".cubin", ".fatbin"))}
        info["proxy_calls"] = src.count(PROXY)
        info["wrapper_chars"] = len(src)
        kernels: dict[str, Any] = {}
        for kernel, body in _split_calls(src).items():
            k: dict[str, Any] = {}
            ka = re.search(r"void\* kernel_args_\[\] = \{(.*?)\};", body, re.S)
            k["wrapper_kernel_args"] = len([a for a in ka.group(1).split(",") if a.strip()]) if ka else None
            lk = re.search(r"loadKernel\((.*?)\);", body, re.S)
            k["loadKernel"] = " ".join(lk.group(1).split()) if lk else None
            la = re.search(r"launchKernel\((.*?)\);", body, re.S)
            k["launchKernel"] = " ".join(la.group(1).split()) if la else None
            grid = re.findall(r"uint32_t grid_\d = (.*?);", body)
            k["grid"] = grid
            rec = _RECORDED.get(kernel)
            k["param_cache"] = rec
            cubin = None
            cached = CudaKernelParamCache.cache.get(kernel) or {}
            cpath = cached.get("cubin_path")
            if cpath and os.path.exists(cpath):
                cubin = Path(cpath).read_bytes()
            elif lk:
                m = re.search(r'"([^"]+\.(?:cubin|fatbin))"', lk.group(1))
                if m and Path(m.group(1)).name in blobs:
                    cubin = z.read(blobs[Path(m.group(1)).name])
            mangled = (rec or {}).get("mangled_name")
            if cubin is not None and mangled:
                try:
                    sizes = _cubin_params(cubin, mangled)
                except Exception as e:  # a diagnosis must not stop the case
                    sizes = f"{type(e).__name__}: {e}"
                k["cubin_param_sizes"] = sizes
                if isinstance(sizes, list) and k["wrapper_kernel_args"] is not None:
                    k["args_match"] = len(sizes) == k["wrapper_kernel_args"]
            else:
                k["cubin_param_sizes"] = "cubin not found"
            kernels[kernel] = k
        info["kernels"] = kernels
        info["mismatched_kernels"] = [n for n, k in kernels.items() if k.get("args_match") is False]
    return info


def _sync() -> None:
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


def _rel(out: Any, ref: Any) -> float:
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-6))


def child(name: str, work: Path) -> int:
    """Run one case, printing @@STAGE / @@INFO / @@RESULT lines; exceptions end it with rc 1."""
    import faulthandler

    faulthandler.enable(all_threads=True)
    case = BY_NAME[name]
    _stage("build")
    import torch

    import qlower

    torch.manual_seed(0)
    model, args = BUILDERS[case.model](**case.margs)
    if case.patch:
        PATCHES[case.patch]()
    _stage("eager")
    with torch.no_grad():
        want = model(*args)
    _sync()
    _stage("export")
    dyn = ({0: torch.export.Dim("batch", min=1, max=1024)},) if case.dynamic else None
    ep = torch.export.export(model, args, dynamic_shapes=dyn)
    _stage("compile")
    _record_param_cache()
    opts: dict[str, Any] = {"force_disable_caches": True, **case.configs}
    if case.qlower:
        qlower.clear_reports()
        opts = qlower.inductor_options(kernel_preference=case.pref, **opts)
    t = time.time()
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(work / "model.pt2"), inductor_configs=opts
    )
    _emit("INFO", {"compile_s": round(time.time() - t, 1)})
    if case.qlower:
        rep = qlower.last_report()
        _emit("INFO", {"lowerings": [getattr(d, "lowering", str(d)) for d in rep]})
    _stage("inspect")
    try:
        _emit("INFO", {"package": _inspect(path)})
    except Exception as e:
        _emit("INFO", {"inspect_error": f"{type(e).__name__}: {e}"})
    _stage("load")
    runner = torch._inductor.aoti_load_package(path)
    _stage("run")
    with torch.no_grad():
        got = runner(*args)
    _sync()
    _stage("match")
    errs = {str(args[0].shape[0]): _rel(got, want)}
    if case.dynamic:
        for m in DYN_SIZES:
            x = torch.randn(m, *args[0].shape[1:], device=DEV, dtype=args[0].dtype)
            with torch.no_grad():
                w2 = model(x)
                g2 = runner(x)
            _sync()
            errs[str(m)] = _rel(g2, w2)
    _emit("INFO", {"rel_err": errs})
    ok = all(e < 2e-2 for e in errs.values())
    _emit("RESULT", {"match": ok})
    if ok:
        _stage("ok")
    return 0 if ok else 2


# ---------------------------------------------------------------------------------------------- parent side


def _signal_name(rc: int) -> str | None:
    if rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _wrapper_source(work: Path, cache: Path, since: float) -> tuple[str | None, str]:
    """The generated wrapper: from the case's package if it exists, else the newest one written in the shared
    Inductor cache since the case started (with cases running in parallel it may be another case's)."""
    pkg = work / "model.pt2"
    if pkg.exists():
        try:
            with zipfile.ZipFile(pkg) as z:
                names = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
                if names:
                    return "".join(z.read(n).decode(errors="ignore") for n in names), "package"
        except zipfile.BadZipFile:
            pass
    cands = [p for p in cache.rglob("*.wrapper.cpp") if p.stat().st_mtime >= since]
    if not cands:
        return None, "none found"
    newest = max(cands, key=lambda p: p.stat().st_mtime)
    return newest.read_text(
        errors="ignore"
    ), f"newest in the shared cache ({newest.name}; may be another case's)"


class Runner:
    """Runs cases in subprocesses under one deadline and keeps the json/log up to date after each."""

    def __init__(self, out: Path, deadline: float, root: Path) -> None:
        self.out, self.deadline, self.root = out, deadline, root
        self.lock = threading.Lock()
        self.results: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, str] = {}
        self.wrappers = 0
        self.header: dict[str, Any] = {}

    def run(self, case: Case) -> None:
        left = self.deadline - time.time()
        entry: dict[str, Any] = {"case": case.name, "doc": case.doc, "stage": "not run"}
        if left < 25:
            entry["skipped"] = f"deadline ({left:.0f} s left)"
            self._store(case, entry, "")
            return
        work = self.root / case.name
        work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1", **case.env}
        # one Inductor cache for all cases (precompiled headers are built once); force_disable_caches keeps
        # every compile fresh, so qlower's pass always runs
        env["TORCHINDUCTOR_CACHE_DIR"] = os.environ.get(
            "TORCHINDUCTOR_CACHE_DIR", str(self.root / "inductor")
        )
        env["QLOWER_CACHE_DIR"] = os.environ.get("QLOWER_CACHE_DIR", str(self.root / "qlower_cache"))
        cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", case.name, str(work)]
        t0 = time.time()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=max(5.0, left - 5))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and its compile workers
            output, _ = proc.communicate()
        text = output.decode(errors="replace")
        rc = proc.returncode
        entry.update(
            rc=rc, signal=_signal_name(rc), timed_out=timed_out, elapsed_s=round(time.time() - t0, 1)
        )
        stages, info = ["start"], {}
        for line in text.splitlines():
            if line.startswith("@@STAGE "):
                stages.append(json.loads(line[8:]))
            elif line.startswith("@@INFO "):
                info.update(json.loads(line[7:]))
            elif line.startswith("@@RESULT "):
                info.update(json.loads(line[9:]))
        entry["stage"] = stages[-1]
        entry["ok"] = stages[-1] == "ok"
        entry["failed_in"] = None if entry["ok"] else stages[-1]
        entry.update(info)
        last_err = [
            ln for ln in text.splitlines() if re.match(r"^([\w.]*(Error|Exception)\b|Fatal Python error)", ln)
        ]
        entry["error"] = last_err[-1][:500] if last_err else None
        if not entry["ok"] or case.dump:
            self._dump_wrapper(case, work, entry, t0)
        self._store(case, entry, text)
        shutil.rmtree(work, ignore_errors=True)

    def _dump_wrapper(self, case: Case, work: Path, entry: dict[str, Any], since: float) -> None:
        with self.lock:
            if self.wrappers >= MAX_WRAPPERS:
                entry["wrapper_file"] = "not dumped (limit)"
                return
            self.wrappers += 1
        cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(self.root / "inductor")))
        src, where = _wrapper_source(work, cache, since)
        entry["wrapper_from"] = where
        if src is None:
            entry["wrapper_file"] = "none found"
            return
        dest = self.out / f"{case.name}.wrapper.cpp"
        dest.write_text(src[: 15 * 2**20])
        entry["wrapper_file"] = dest.name

    def _store(self, case: Case, entry: dict[str, Any], text: str) -> None:
        limit = LOG_TAIL_BIG if case.env.get("TORCH_LOGS") else LOG_TAIL
        brief = {k: v for k, v in entry.items() if k != "package"}
        log = [f"===== {case.name}: {case.doc}", json.dumps(brief, default=str, indent=1)]
        if "package" in entry:
            log.append("package: " + json.dumps(entry["package"], default=str, indent=1))
        log.append(f"----- output (last {limit} chars)")
        log.append(text[-limit:])
        with self.lock:
            self.results[case.name] = entry
            self.logs[case.name] = "\n".join(log)
            self._write()

    def _write(self) -> None:
        order = [c.name for c in CASES if c.name in self.results]
        summary = {
            n: (
                "ok"
                if self.results[n].get("ok")
                else self.results[n].get("skipped")
                or f"failed in {self.results[n].get('stage')}"
                + (f" ({self.results[n]['signal']})" if self.results[n].get("signal") else "")
            )
            for n in order
        }
        doc = {**self.header, "summary": summary, "cases": [self.results[n] for n in order]}
        (self.out / "aoti_exp.json").write_text(json.dumps(doc, default=str, indent=1))
        head = json.dumps({**self.header, "summary": summary}, default=str, indent=1)
        (self.out / "aoti_exp.log").write_text(head + "\n\n" + "\n\n".join(self.logs[n] for n in order))


def _header() -> dict[str, Any]:
    """Versions and device, from a short child (the parent never touches CUDA)."""
    code = (
        "import json, torch, triton; ok = torch.cuda.is_available(); "
        "p = torch.cuda.get_device_properties(0) if ok else None; "
        "print(json.dumps({'torch': torch.__version__, 'triton': triton.__version__, 'cuda': torch.version.cuda, "
        "'gpu': p.name if ok else None, 'capability': [p.major, p.minor] if ok else None}))"
    )
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(res.stdout.strip().splitlines()[-1])
    except Exception as e:
        return {"header_error": f"{type(e).__name__}: {e}"}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return child(argv[1], Path(argv[2]))
    t0 = time.time()
    budget = float(os.environ.get("QLOWER_EXP_BUDGET", "285"))
    jobs = int(os.environ.get("QLOWER_EXP_JOBS", "4"))
    unknown = [a for a in argv if a not in BY_NAME]
    if unknown:
        print(f"unknown cases {unknown}; known: {list(BY_NAME)}", file=sys.stderr)
        return 2
    cases = [BY_NAME[a] for a in argv] or list(CASES)
    out = Path(os.environ.get("OUT", "./out"))
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="qlower_aoti_exp_"))
    runner = Runner(out, t0 + budget, root)
    runner.header = {**_header(), "budget_s": budget, "jobs": jobs}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for fut in [pool.submit(runner.run, c) for c in cases]:
            fut.result()
    runner.header["total_s"] = round(time.time() - t0, 1)
    with runner.lock:
        runner._write()
    shutil.rmtree(root, ignore_errors=True)
    for name, entry in ((c.name, runner.results.get(c.name, {})) for c in cases):
        status = "ok" if entry.get("ok") else entry.get("skipped") or f"FAILED in {entry.get('stage')}"
        sig = f" {entry['signal']}" if entry.get("signal") else ""
        print(f"{name:34s} {status}{sig}  {entry.get('error') or ''}")
    print(f"wrote {out / 'aoti_exp.json'} and {out / 'aoti_exp.log'} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
