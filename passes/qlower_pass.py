"""The Inductor custom pass: find records per family, let the registry choose, emit, report.

Installed as Inductor's `joint_custom_pre_pass`. That hook runs for every inference compile, with and without
`freezing`, and for AOTInductor, and it runs *before* freezing's constant folding (which would otherwise fold
`w_int8.to(bf16)` into a bf16 constant and lose the int8 weight) and before the post-grad patterns (whose
woq rewrite calls `_weight_int8pack_mm` without checking its K constraint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from pathlib import Path

from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from qlower.lowerings import KernelPreference, choose, fingerprint
from qlower.lowerings.aoti import runtime as aoti_runtime
from qlower.lowerings.emit.mx_readers import legalize_e8m0, note_lowered, redecode_readers
from qlower.lowerings.graph import inductor_fixes
from qlower.lowerings.graph.builder import EMITTED_BRANCH
from qlower.lowerings.preference import parse_preference
from qlower.lowerings.registry import Choice, decision_env
from qlower.passes import report as reporting
from qlower.passes.canonicalize import canonicalize
from qlower.patterns import FAMILIES, QuantLinear, Rejection
from qlower.patterns.graph_utils import tensor_val
from qlower.patterns.unclaimed import find_unclaimed

# Environment variables the pass itself reads (each backend declares those its rules read: `decision_env`).
PASS_ENV = ("QLOWER_AOTI_SHIMS",)


def _source_files() -> tuple[str, ...]:
    """Every source file of qlower's packages, the public API included (found by spec: nothing here imports
    the public API package `qlower`)."""
    import qlower.lowerings
    import qlower.passes
    import qlower.patterns

    public = importlib.util.find_spec("qlower")
    roots = {Path(m.__file__).parent for m in (qlower.passes, qlower.patterns, qlower.lowerings)}
    roots |= {Path(p) for p in (public.submodule_search_locations or [])} if public else set()
    return tuple(sorted(str(p) for root in roots for p in root.rglob("*.py")))


def _describe_shape(rec: QuantLinear | Rejection) -> tuple:
    return tuple(rec.shape) if rec.shape is not None else ("?", "?", "?")


class QLowerPass(CustomGraphPass):
    """Rewrites every recognised quantized linear to the best lowering of its device."""

    def __init__(self, families: tuple[str, ...], preference: KernelPreference) -> None:
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"qlower: unknown families {unknown}; known: {sorted(FAMILIES)}")
        # `FAMILIES`' order, not the caller's: a decision must not depend on the order of a set
        self.families = tuple(f for f in FAMILIES if f in families)
        self.preference = parse_preference(preference)
        # Inductor work-arounds for any graph the pass is installed on: once per process, here where every
        # pass is made (`qlower.inductor_options()`, or by hand), never per graph
        inductor_fixes.apply_graph_fixes()

    def __repr__(self) -> str:
        return f"QLowerPass(families={self.families}, kernel_preference={self.preference})"

    def __eq__(self, other: object) -> bool:
        """Passes of equal configuration are one backend to Dynamo: `torch.compile(options=d)` compares the
        options dicts (`BACKEND_MATCH`), so blocks compiled one by one with equal `inductor_options(...)`
        share one graph instead of hitting the recompile limit
        (tests/end_to_end/test_per_block_compile.py)."""
        return type(other) is type(self) and self._config() == other._config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._config())

    def _config(self) -> tuple[tuple[str, ...], str]:
        return (self.families, self.preference.value)

    def __call__(self, graph: fx.Graph) -> None:
        if _is_emitted_branch(graph):
            return
        report = reporting.start_graph()
        reporting.dump_graph(graph)
        canonicalize(graph, self.families)  # bmm-spelled linears and producers' ops reach them as mm
        covered: set[fx.Node] = set()  # every node a decision of this graph is about
        for family in self.families:
            self._lower_family(graph, family, report, covered)
        for row in find_unclaimed(graph, covered, self.families):  # no linear-shaped product stays silent
            reporting.add(report, self._lower(graph, row))
        if "mx" in self.families:
            redecode_readers(graph)  # what reads a lowered MX decode reads qlower's exact one
            legalize_e8m0(graph)  # what stays unlowered must still compile (no e8m0 type in C++ codegen)
        graph.lint()
        aoti_runtime.prepare_compile(graph)  # AOTInductor: this compile calls qlower's ops through C shims

    def _lower_family(
        self, graph: fx.Graph, family: str, report: reporting.Report, covered: set[fx.Node]
    ) -> None:
        """Decide every candidate of one family once.

        A rewrite erases its matched nodes, and a later candidate found in the same scan may reference one of
        them (a residual add that two linears share, say): such a stale candidate triggers a fresh scan.
        Nodes qlower emitted are never candidates again. Each rescan follows at least one decision, so the
        loop ends.
        """
        decided: set[fx.Node] = set()
        rescan = True
        while rescan:
            rescan = False
            for cand in FAMILIES[family](graph):
                anchor = cand.anchor if isinstance(cand, Rejection) else cand.output
                if anchor in decided or _emitted_by_qlower(cand):
                    continue
                if _is_stale(cand):
                    rescan = True
                    break
                decided.add(anchor)
                covered.update(_record_nodes(cand))
                reporting.add(report, self._lower(graph, cand))

    def _lower(self, graph: fx.Graph, cand: QuantLinear | Rejection) -> reporting.Decision:
        if isinstance(cand, Rejection):
            return reporting.Decision(
                family=cand.family,
                device=str(cand.device),
                shape=_describe_shape(cand),
                shape_label=reporting.shape_label(_describe_shape(cand)),
                dtype=str(cand.dtype),
                lowering=None,
                reason=cand.reason,
                node=cand.anchor.name,
            )
        choice = choose(cand, self.preference)
        base = dict(
            family=cand.family,
            device=str(cand.device),
            shape=_describe_shape(cand),
            shape_label=reporting.shape_label(_describe_shape(cand)),
            dtype=str(cand.compute_dtype),
            form=cand.form,
            node=cand.output.name,
        )
        if choice.lowering is None:
            return reporting.Decision(
                lowering=None, reason=choice.reason, passed_over=choice.passed_over, **base
            )
        why = _why_chosen(choice, self.preference, cand)
        new = choice.lowering.emit(graph, cand, self.preference)
        _check_same_value(cand.output, new)
        cand.output.replace_all_uses_with(new)
        _erase_dead(graph, cand.nodes)
        note_lowered(graph, cand)
        for node in cand.kept:  # left for their other readers: no family's candidate any more
            node.meta["qlower"] = "kept"
        return reporting.Decision(
            lowering=choice.lowering.name,
            reason=None,
            kind=choice.lowering.kind.name,
            why=why,
            passed_over=choice.passed_over,
            **base,
        )

    def uuid(self) -> str:
        """Cache key: qlower's sources, the options, the registered lowerings and the env that steers choices.

        Its value is a function of those alone: Inductor's caches ask for it in every compile that carries the
        pass, and a pass manager (vLLM's) from the configuration alone, so it opens no report (the pass opens
        its compile's report when it runs). Two first-use effects: the built-in backends load if nothing has
        used the registry yet (lowerings/registry.py), and with them qlower's ops, which a graph the caches
        serve calls without the pass having run; and inside a Dynamo compile it notes that the compile carries
        this pass, so that one served whole from the AOTAutograd cache gets a report of its own saying so
        (`reporting.note_cache_key`), never the previous compile's rows."""
        reporting.note_cache_key(repr(self))
        h = hashlib.sha256(get_hash_for_files(_source_files()))
        env = tuple((name, os.environ.get(name)) for name in (*PASS_ENV, *decision_env()))
        h.update(repr((self.families, self.preference.value, fingerprint(), env)).encode())
        return h.hexdigest()


def _record_nodes(cand: QuantLinear | Rejection) -> list[fx.Node]:
    """Every graph node a candidate refers to (its fields, nested lists and ActQuant included)."""
    out: list[fx.Node] = []

    def walk(value: object) -> None:
        if isinstance(value, fx.Node):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name))

    walk(cand)
    return out


def _is_stale(cand: QuantLinear | Rejection) -> bool:
    return any(getattr(n, "_erased", False) for n in _record_nodes(cand))


def _is_emitted_branch(graph: fx.Graph) -> bool:
    """A branch graph of a `torch.cond` qlower emitted: Inductor runs the joint passes on subgraphs a pass
    created (lowerings/graph/triton_inline.py marks them)."""
    module = graph.owning_module
    return module is not None and bool(module.meta.get(EMITTED_BRANCH))


def _emitted_by_qlower(cand: QuantLinear | Rejection) -> bool:
    if isinstance(cand, Rejection):
        return bool(cand.anchor.meta.get("qlower"))
    return any(n.meta.get("qlower") for n in (cand.output, *cand.nodes))


def _why_chosen(choice: Choice, preference: KernelPreference, record: QuantLinear) -> str:
    """The choice's own reason: the preference that chose it, its rank where lowerings ranked above it were
    passed over (`AUTO #3`; their reasons: `Decision.passed_over`, `Report.explain`), what the lowering is."""
    lowering = choice.lowering
    assert lowering is not None
    rank = f" #{len(choice.passed_over) + 1}" if choice.passed_over else ""
    detail = f" [{lowering.detail(record)}]" if lowering.detail is not None else ""
    return f"{preference.name}{rank}: {lowering.doc or lowering.name}{detail}"


def _check_same_value(old: fx.Node, new: fx.Node) -> None:
    """A lowering must produce exactly the shape and dtype of what it replaces."""
    a, b = tensor_val(old), tensor_val(new)
    if a is None or b is None or a.dtype != b.dtype or a.dim() != b.dim():
        raise AssertionError(f"qlower: lowering changed {old.name}: {a} -> {b}")


def _erase_dead(graph: fx.Graph, nodes: tuple[fx.Node, ...]) -> None:
    pending = [n for n in nodes if n.graph is graph]
    changed = True
    while changed:
        changed = False
        for node in list(pending):
            if not node.users:
                graph.erase_node(node)
                pending.remove(node)
                changed = True
