"""A benchmark run's metadata: where its files go by default, the device it ran on, the versions it ran with
(bench.py, bench_model.py, bench_train.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

import qlower

DEFAULT_OUT = "bench-out"  # scratch folder under the cwd; `--out benchmarks` refreshes the committed tables


def describe_device(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    name = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}"


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "qlower": qlower.__version__}
    try:  # which code was measured: other work may be uncommitted in the same checkout
        git = ["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always", "--dirty"]
        out["git"] = subprocess.run(git, capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out
