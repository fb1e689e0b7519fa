#!/usr/bin/env bash
# Set up a fresh machine (venv, CPU torch 2.13, qlower) and run the demo on the built-in model.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e .
exec .venv/bin/python -m qlower demo "$@"
