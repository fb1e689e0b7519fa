# Sourced by scripts/run_demo.sh and scripts/run_tests.sh from the repository root: create .venv and give it
# torch. A venv's torch >= 2.11 stays (a CUDA build included). Otherwise 2.13.0's CPU build from PyTorch's CPU
# index (PyPI's Linux torch is the multi-GB CUDA build), or from pip's configured indexes where that index does
# not answer. TORCH_INDEX_URL names another index; empty, the configured ones.
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
if ! .venv/bin/python -c 'import sys, torch; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 11))' 2>/dev/null; then
  index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
  if [ -n "$index" ] && .venv/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=10)' "$index" 2>/dev/null; then
    .venv/bin/pip install -q --index-url "$index" torch==2.13.0
  else
    .venv/bin/pip install -q torch==2.13.0
  fi
fi
