"""Medians with their spread, and a warning when timings cannot be trusted.

Why: on a shared or loaded machine the same benchmark swings 2-20x between runs. Every time that
scripts/bench.py, scripts/bench_model.py and `python -m qlower demo` report is the median of its repeats with
the spread of those repeats next to it, and one WARNING line says when a spread is wide or the machine was
loaded while timing (tests/tools/test_bench.py checks both on synthetic series).

The spread is the interquartile range over the median (IQR / median): robust to one slow repeat (a page fault,
a collection), wide when a quarter or more of the repeats moved.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SPREAD_DEFINITION = "± = interquartile range / median of the repeats"
UNSTABLE_SPREAD = 0.15  # a spread above this fraction of the median makes the numbers unreliable


@dataclass(frozen=True)
class Timing:
    """The median of `n` repeats (seconds) and their spread (IQR / median, a fraction)."""

    median: float
    spread: float
    n: int

    def spread_text(self) -> str:
        return format_spread(self.spread)


def iqr_spread(samples: Sequence[float]) -> float:
    """(Q3 - Q1) / median of `samples`; 0 for fewer than two samples or a zero median."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    if med <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / med


def summarize(samples: Sequence[float]) -> Timing:
    """Median and spread of a non-empty series of repeat times."""
    if not samples:
        raise ValueError("summarize: no samples")
    return Timing(statistics.median(samples), iqr_spread(samples), len(samples))


def format_spread(spread: float) -> str:
    return f"±{100 * spread:.0f}%"


def machine_load() -> tuple[float, int] | None:
    """(1-minute load average, CPU count) of this machine; None where the OS has no load average."""
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return None


class LoadWatch:
    """The highest 1-minute load average seen by `sample()`, called after each timed measurement."""

    def __init__(self) -> None:
        self.peak: tuple[float, int] | None = None

    def sample(self) -> None:
        now = machine_load()
        if now is not None and (self.peak is None or now[0] > self.peak[0]):
            self.peak = now


def stability_warning(
    spreads: Mapping[str, float],
    load: tuple[float, int] | None = None,
    threshold: float = UNSTABLE_SPREAD,
) -> str | None:
    """One line starting with WARNING when any spread (by label) exceeds `threshold` or the load average
    exceeded the CPU count; None when the timings look stable."""
    wide = {k: s for k, s in spreads.items() if s > threshold}
    reasons = []
    if wide:
        worst = max(wide, key=wide.__getitem__)
        reasons.append(
            f"{len(wide)} of {len(spreads)} timings spread over {format_spread(threshold)} "
            f"(worst {worst} {format_spread(wide[worst])})"
        )
    if load is not None and load[0] > load[1]:
        reasons.append(f"load average {load[0]:.1f} on {load[1]} CPUs")
    if not reasons:
        return None
    return "WARNING: timings unreliable (" + "; ".join(reasons) + "): rerun on a quiet machine"
