"""Shared pytest setup: GPU tests skip cleanly on CPU machines; each test starts from a clean Dynamo state.

What test files share otherwise is importable: `tests.helpers` (the subprocess hang guard
`SUBPROCESS_TIMEOUT_S`, ...) and the model forms, `tests.forms`.
"""

from __future__ import annotations

import pytest
import torch

import qlower


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _isolated_compiles():
    """Each test compiles from scratch: no Dynamo state, no FX-graph or AOTAutograd cache hits across tests,
    and an empty report history (it keeps the last 64 reports: a test counting them after a worker's earlier
    tests filled it would see the count stand still).

    Cache hits would skip qlower's pass (no report) and, for tensor subclasses without a stable cache hash
    (torchao's Int8Tensor), can even return another test's graph. Tests of caching turn them back on.
    """
    torch._dynamo.reset()
    qlower.clear_reports()
    torch.manual_seed(0)
    saved = torch._inductor.config.get_config_copy()  # torchao's quantize_ flips global Inductor knobs
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield
    torch._inductor.config.load_config(saved)
    torch._dynamo.reset()


@pytest.fixture
def int_mm_only(monkeypatch):
    """CPU dynamic int8 on `_int_mm` at every M: qlower.int8_gemm (M <= 4 by default) off, for tests of the
    `_int_mm` graph forms."""
    from qlower.lowerings.devices import cpu

    monkeypatch.setattr(cpu, "INT8_GEMM_MAX_M", 0)
