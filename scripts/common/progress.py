"""The progress of a benchmark run over its shapes or rows: a bar with an ETA on a terminal, one line per
finished step elsewhere (bench.py, bench_model.py)."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Progress over the shapes of a run, with the elapsed time and an ETA (mean time per finished shape).

    On a terminal (`tty`): one bar redrawn in place with `\\r`, cut to the terminal's width, the current step
    after it. Otherwise (logs, CI, a pipe): one whole line per finished shape. `set_postfix_str` names the
    current step; `update` counts finished shapes."""

    def __init__(
        self, total: int, desc: str, stream: Any = None, tty: bool | None = None, width: int = 24
    ) -> None:
        self.total, self.done, self.desc, self.text, self.width = total, 0, desc, "", width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.start = time.perf_counter()
        self._drawn = 0.0

    def eta(self) -> float | None:
        """Seconds left at the mean time of the finished shapes; None before the first."""
        if not self.done:
            return None
        return (time.perf_counter() - self.start) / self.done * (self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        times = f"{_fmt_duration(time.perf_counter() - self.start)} elapsed, ETA " + (
            _fmt_duration(eta) if eta is not None else "--"
        )
        if not self.tty:
            return f"{self.desc} [{self.done}/{self.total}] {self.text} · {times}"
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        pct = 100 * self.done // max(self.total, 1)
        return f"{self.desc} [{bar}] {self.done}/{self.total} {pct:3d}% {times} · {self.text}"

    def _draw(self) -> None:
        cols = shutil.get_terminal_size((100, 20)).columns - 1
        self.stream.write("\r" + self.line()[:cols].ljust(cols))
        self.stream.flush()
        self._drawn = time.perf_counter()

    def set_postfix_str(self, text: str) -> None:
        self.text = text
        if self.tty and time.perf_counter() - self._drawn > 0.1:
            self._draw()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.tty:
            self._draw()
        else:
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
