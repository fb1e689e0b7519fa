"""The woq-int8 benchmark under its first name, an alias: `python -m scripts.bench_woq [args]` is
`python -m scripts.bench --family woq_int8 [args]`."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_woq", *sys.argv[1:]])

from scripts import bench

if __name__ == "__main__":
    sys.exit(bench.main(["--family", "woq_int8", *sys.argv[1:]]))
