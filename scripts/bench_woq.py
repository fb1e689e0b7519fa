"""Alias kept for issue 2: `python scripts/bench_woq.py [args]` = `python scripts/bench.py --family woq_int8 [args]`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402

if __name__ == "__main__":
    sys.exit(bench.main(["--family", "woq_int8", *sys.argv[1:]]))
