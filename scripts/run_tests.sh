#!/usr/bin/env bash
# Set up a fresh machine (venv, CPU torch 2.13, qlower with test extras) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
# torch: as in scripts/run_demo.sh (a venv's torch >= 2.11 stays; else 2.13.0's CPU build).
if ! .venv/bin/python -c 'import sys, torch; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 11))' 2>/dev/null; then
  index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
  if [ -n "$index" ] && .venv/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=10)' "$index" 2>/dev/null; then
    .venv/bin/pip install -q --index-url "$index" torch==2.13.0
  else
    .venv/bin/pip install -q torch==2.13.0
  fi
fi
.venv/bin/pip install -q -e '.[test]'
# One pytest worker per core (at most 4): most of the suite's time is single-threaded compilation. `loadfile`
# keeps each test file on one worker, so a module's compiled fixtures are built once.
workers=$(nproc 2>/dev/null || echo 2)
workers=${QLOWER_TEST_WORKERS:-$(( workers > 4 ? 4 : workers ))}
exec .venv/bin/pytest -n "$workers" --dist loadfile "$@"
