#!/usr/bin/env bash
# Set up a fresh machine (venv, CPU torch 2.13, qlower) and run the demo on the built-in model.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup_venv.sh  # .venv with torch (see there)
# numpy: torch warns at import without it.
.venv/bin/pip install -q -e . numpy
exec .venv/bin/python -m qlower demo "$@"
