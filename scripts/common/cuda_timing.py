"""GPU time of a call, the way every CUDA benchmark and experiment script here measures it.

CUDA-graph replays of one call per weight set (`calls`), so host launch overhead is out and weights come from
HBM, not L2; the median replay divided by the calls in it. Without CUDA (the scripts' CPU smoke modes) the
wall time of one round, which only exercises the path.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def gpu_time_us(calls: list[Callable[[], Any]], replays: int = 7, min_reps: int = 1) -> float:
    """Median GPU time of one call, from CUDA-graph replays of all `calls` (one per weight set)."""
    if not torch.cuda.is_available():
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) * 1e6 / len(calls)
    for c in calls:
        c()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for c in calls:
        c()
    e1.record()
    torch.cuda.synchronize()
    est_ms = max(e0.elapsed_time(e1), 1e-3)  # upper bound (includes host launch time)
    reps = int(min(20, max(min_reps, 4.0 / est_ms)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for c in calls:
                c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    del graph
    return statistics.median(times) * 1000.0 / (reps * len(calls))
