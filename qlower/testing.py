"""Helpers for expect-tests on traced graphs: the graph exactly as qlower's pass sees it, without codegen.

gm = qlower.testing.trace_for_inductor(model, x)          # aten graph, Inductor's decompositions
gm, primals = qlower.testing.trace_joint_for_inductor(model, x)   # x.requires_grad: the training graph
report = qlower.testing.apply_pass(gm)                     # rewrite in place, like inside Inductor
self.assertExpectedInline(qlower.testing.graph_summary(gm), '''...''')
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import fx

from qlower.lowerings import KernelPreference
from qlower.passes import QLowerPass, Report, report
from qlower.patterns import FAMILIES


def trace_for_inductor(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> fx.GraphModule:
    """The inference graph Inductor's joint pass receives for `fn(*args)` (Dynamo + AOTAutograd, no codegen)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    captured: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        # No copy: the graph runs once during this call, before the caller rewrites it (and deepcopy fails
        # on some tensor-subclass constants).
        captured.append(gm)
        return gm.forward

    backend = aot_autograd(fw_compiler=keep, inference_compiler=keep, decompositions=select_decomp_table())
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*args)
    assert len(captured) == 1, f"expected one graph, got {len(captured)}"
    return captured[0]


def trace_joint_for_inductor(
    fn: Callable[..., Any], *args: Any, dynamic: bool = False
) -> tuple[fx.GraphModule, list[Any]]:
    """The joint forward + backward graph Inductor's joint pass receives when `fn(*args)` needs gradients
    (inputs or parameters that require grad: a training step's graph), and its primals: the flat inputs of
    the call (parameters and buffers included, torchao's tensor subclasses as the plain tensors AOTAutograd
    unwraps them to). `gm(primals, joint_tangents(gm))` runs it: the outputs, then the gradients."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition
    from torch._inductor.decomposition import select_decomp_table

    joints: list[fx.GraphModule] = []
    inputs: list[Any] = []

    def keep(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        joints.append(joint)  # the partition builds new graphs: this one stays as traced, runnable
        return default_partition(joint, joint_inputs, **kwargs)

    def forward(gm: fx.GraphModule, _: Any) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            inputs[:] = args  # the primals, subclasses unwrapped, as the compiled forward receives them
            return gm.forward(*args)

        return run

    aot = aot_autograd(
        fw_compiler=forward,
        bw_compiler=lambda gm, _: gm.forward,
        partition_fn=keep,
        decompositions=select_decomp_table(),
    )

    torch._dynamo.reset()
    with torch.enable_grad():
        torch.compile(fn, backend=aot, dynamic=dynamic, fullgraph=True)(*args)
    assert len(joints) == 1, f"expected one joint graph, got {len(joints)} (does anything require grad?)"
    return joints[0], inputs


def joint_tangents(gm: fx.GraphModule, seed: int = 0) -> list[torch.Tensor]:
    """Random cotangents for a joint graph's `tangents_*` placeholders (their shapes and dtypes)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.name.startswith("tangents"):
            v = node.meta["val"]
            out.append(torch.randn(tuple(int(d) for d in v.shape), generator=g).to(v.dtype))
    return out


def apply_pass(
    gm: fx.GraphModule,
    *,
    families: Iterable[str] | None = None,
    kernel_preference: KernelPreference = KernelPreference.AUTO,
) -> Report:
    """Run qlower's pass on a traced graph in place and return its decisions."""
    qpass = QLowerPass(tuple(FAMILIES) if families is None else tuple(families), kernel_preference)
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    context = torch._guards.tracing(torch._guards.TracingContext(fake_mode)) if fake_mode else _null()
    with context:
        qpass(gm.graph)
        out = report.last_report()
    gm.recompile()
    return out


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _fmt(arg: Any) -> str:
    if isinstance(arg, fx.Node):
        return arg.name
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(_fmt(a) for a in arg) + "]"
    if isinstance(arg, torch.dtype):
        return str(arg).replace("torch.", "")
    return repr(arg)


def _target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        ns, name = t.namespace, t._schema.name.split("::")[-1]
        overload = t._overloadname
        return f"{ns}.{name}" + ("" if overload == "default" else f".{overload}")
    return getattr(t, "__name__", str(t))


def graph_summary(gm: fx.GraphModule | fx.Graph) -> str:
    """One line per op node, `name: dtype[shape] = op(args)`: stable text for expect-tests."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    lines = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        v = node.meta.get("val")
        ty = f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}" if isinstance(v, torch.Tensor) else "sym"
        args = [_fmt(a) for a in node.args] + [f"{k}={_fmt(v)}" for k, v in node.kwargs.items()]
        lines.append(f"{node.name}: {ty} = {_target_name(node)}({', '.join(args)})")
    return "\n".join(lines)


@contextlib.contextmanager
def fake_sm90() -> Iterator[None]:
    """Lower as on an H100 on any machine: its device facts (capability 9.0, 132 multiprocessors, its name, CUDA
    available) for the lowering rules and kernel choices, and qlower's CUTLASS library taken as built (nothing
    is loaded while lowering). For graphs traced with fake CUDA tensors (`scripts/bench_pass.py`); nothing runs
    on a device. The caches that hold device facts are emptied before and after."""
    from qlower.lowerings.devices.cuda import override_cuda_capability
    from qlower.lowerings.kernels.cutlass import build as cutlass_build
    from qlower.lowerings.kernels.cutlass import configs as cutlass_configs
    from qlower.lowerings.kernels.cutlass import w8a16
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    props = types.SimpleNamespace(multi_processor_count=132, name="NVIDIA H100 80GB HBM3", major=9, minor=0)
    cached = (cutlass_configs.device_name, w8a16.sm_count)
    for fn in cached:
        fn.cache_clear()
    patches = [
        mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: (9, 0)),
        mock.patch.object(torch.cuda, "get_device_properties", lambda device=None: props),
        mock.patch.object(torch.cuda, "get_device_name", lambda device=None: props.name),
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(
            mx_ops, "bf16_decodes", lambda x_dtype, w_fmt: w_fmt == mx_ops.E2M1 and x_dtype == torch.bfloat16
        ),
        mock.patch.object(cutlass_build, "library", lambda: Path("/nonexistent/libqlower_cutlass_sm90.so")),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(override_cuda_capability((9, 0)))
        try:
            yield
        finally:
            for fn in cached:
                fn.cache_clear()
