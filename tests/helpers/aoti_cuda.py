"""When a CUDA AOTInductor package can be loaded in this test process.

On the H200 image (torch 2.11), `aoti_load_package` of any CUDA package, a plain model without qlower
included, segfaults in the package's std::regex: two copies of libstdc++'s locale symbols clash (the native
backtrace is in docs/device-image.md). Preloading the system libstdc++ fixes it:
    LD_PRELOAD=$(readlink -f $(g++ -print-file-name=libstdc++.so.6)) \
        pytest -m gpu tests/integrations/aoti/test_aoti_export.py
Without it the CUDA load tests skip (a segfault would end the whole run). QLOWER_AOTI_CUDA_LOAD=1 runs them on
a machine without the clash.
"""

from __future__ import annotations

import os

import pytest

LOADABLE = "libstdc++" in os.environ.get("LD_PRELOAD", "") or os.environ.get("QLOWER_AOTI_CUDA_LOAD") == "1"

needs_cuda_package_load = pytest.mark.skipif(
    not LOADABLE,
    reason="loading a CUDA AOTI package segfaults on the torch 2.11 image unless the system libstdc++ is "
    "preloaded (tests/helpers/aoti_cuda.py says how); set QLOWER_AOTI_CUDA_LOAD=1 where it does not",
)
