#!/usr/bin/env bash
# Set up a fresh machine (venv, CPU torch 2.13, qlower with the test and cuda extras: the CUDA sources compile
# without a GPU) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_venv.sh  # .venv with torch (see there)
.venv/bin/pip install -q -e '.[test,cuda]'
# One pytest worker per core (at most 4): most of the suite's time is single-threaded compilation. `loadfile`
# keeps each test file on one worker, so a module's compiled fixtures are built once.
workers=$(nproc 2>/dev/null || echo 2)
workers=${QLOWER_TEST_WORKERS:-$(( workers > 4 ? 4 : workers ))}
exec .venv/bin/pytest -n "$workers" --dist loadfile "$@"
