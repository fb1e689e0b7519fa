"""The rules of the layout (docs/layout.md), checked on the sources: which package may import which,
and no import cycles among module-level imports; and in fresh processes, what importing a package loads and
registers."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

PACKAGES = {
    "qlower": "qlower",
    "passes": "qlower.passes",
    "patterns": "qlower.patterns",
    "lowerings": "qlower.lowerings",
}
PATTERNS_FOR_LOWERINGS = {
    "qlower.patterns.record",
    "qlower.patterns.graph_utils",
    "qlower.patterns.mx_format",
}
PUBLIC_API_OK = {
    "qlower.lowerings",
    "qlower.passes",
    "qlower.patterns",
}  # what the public API's sibling packages may import of qlower


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [*pkg.split("."), *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(path: Path, top_level_only: bool, top: str = "qlower") -> set[str]:
    """Modules of package `top` that `path` imports (`from a.b import c` counts a.b and a.b.c)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))  # lazy imports count for layering
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == top or m.startswith(top + ".")}


def test_patterns_import_nothing_of_qlower_outside_patterns():
    bad = {
        name: sorted(m for m in _imports(p, False) if not m.startswith("qlower.patterns"))
        for name, p in _modules().items()
        if name.startswith("qlower.patterns")
    }
    assert not {k: v for k, v in bad.items() if v}


def test_lowerings_take_only_the_record_fx_helpers_and_formats_from_patterns():
    mods = _modules()
    bad = {}
    for name, p in mods.items():
        if name.startswith("qlower.lowerings"):
            used = {m for m in _imports(p, False) if m.startswith("qlower.patterns")}
            extra = {
                m
                for m in used
                if m != "qlower.patterns"
                and not any(m == a or m.startswith(a + ".") for a in PATTERNS_FOR_LOWERINGS)
            }
            extra |= {m for m in used if m == "qlower.patterns" and not _only_submodules(p)}
            if extra:
                bad[name] = sorted(extra)
    assert not bad


def _only_submodules(path: Path) -> bool:
    """`from qlower.patterns import X` where every X is an allowed submodule."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "qlower.patterns":
            if any(f"qlower.patterns.{a.name}" not in PATTERNS_FOR_LOWERINGS for a in node.names):
                return False
    return True


def _names_from(path: Path, prefix: str) -> dict[str, list[str]]:
    """{module under `prefix`: the names `path` takes from it}, lazy imports included."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == prefix or node.module.startswith(prefix + "."):
                found.setdefault(node.module, []).extend(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == prefix or a.name.startswith(prefix + "."):
                    found.setdefault(a.name, []).append("<module>")
    return found


EMITTER_NAME = re.compile(r"^(make_)?emit_\w+$")


def test_devices_take_only_emitters_from_emit():
    """devices/ holds "when", emit/ "how": a device module takes from emit/ the emitters its Lowerings
    name (`emit_*`, `make_emit_*`) and nothing else, so no rule, blocker or crossover is read out of emit/
    (the rules the backends share are devices/common.py's; the scale facts both sides read are
    lowerings/scale_facts.py's)."""
    bad = {}
    for name, path in _modules().items():
        if name.startswith("qlower.lowerings.devices"):
            taken = _names_from(path, "qlower.lowerings.emit")
            wrong = sorted(f"{m}.{n}" for m, ns in taken.items() for n in ns if not EMITTER_NAME.match(n))
            if wrong:
                bad[name] = wrong
    assert not bad


def test_emit_asks_no_device_rules():
    """emit/ never imports devices/ (a lowering's emitter is chosen by the rules, never the other way), and
    defines no rule of its own: no `supports*`, `prefer*` or `*_blocker` function."""
    bad = {}
    for name, path in _modules().items():
        if not name.startswith("qlower.lowerings.emit"):
            continue
        wrong = sorted(m for m in _imports(path, False) if m.startswith("qlower.lowerings.devices"))
        wrong += sorted(
            f"def {node.name}"
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and re.match(r"^_?(supports|prefer)|.*_blocker$", node.name)
        )
        if wrong:
            bad[name] = wrong
    assert not bad


def test_only_devices_read_the_crossovers():
    """AUTO's M crossovers live in one table, devices/crossovers.py, which only devices/ reads (emitters get
    the numbers they need as arguments); no module of lowerings/ passes an emitter the preference by a side
    channel (the registry calls `emit(graph, record, preference)`)."""
    table = "qlower.lowerings.devices.crossovers"
    bad = {
        name: sorted(m for m in _imports(p, False) if m == table or m.startswith(table + "."))
        for name, p in _modules().items()
        if not name.startswith("qlower.lowerings.devices")
    }
    assert not {k: v for k, v in bad.items() if v}
    side_channels = {name for name, p in _modules().items() if re.search(r"\bcontextvars\b", p.read_text())}
    assert not {n for n in side_channels if n.startswith("qlower.lowerings")}, side_channels


def test_every_builtin_emitter_takes_the_preference():
    """Every built-in lowering's emitter takes (graph, record, preference): none is one the registry has to wrap
    (the wrap is for backends registered with (graph, record) emitters)."""
    from qlower.lowerings import backends
    from qlower.lowerings.registry import ensure_builtin_backends

    ensure_builtin_backends()
    wrapped = [
        lw.name
        for backend in backends().values()
        for lw in backend.lowerings
        if getattr(lw.emit, "without_preference", False)
    ]
    assert not wrapped


def test_mx_crossovers_are_the_mx_ops_ranges():
    """The MX crossovers AUTO declines above are the ranges the op's decode and GEMV kernels serve."""
    pytest.importorskip("triton")
    from qlower.lowerings.devices import crossovers
    from qlower.lowerings.kernels.triton.mx import ops

    assert crossovers.MX_WEIGHT_ONLY_TRITON_MAX_M == ops.DECODE_MAX_M
    assert crossovers.MX_DYNAMIC_TRITON_MAX_M == ops.GEMV_MAX_M


def test_graph_editing_knows_no_record_and_no_device():
    """lowerings/graph/ (node builder, Triton inlining, Inductor fixes) is what emit/ and passes/ both use: it
    imports nothing of emit/, devices/, kernels/, the registry or the record, lazy imports included."""
    banned = (
        "qlower.lowerings.emit",
        "qlower.lowerings.devices",
        "qlower.lowerings.kernels",
        "qlower.lowerings.registry",
        "qlower.patterns.record",
        "qlower.passes",
    )
    bad = {
        name: sorted(m for m in _imports(p, False) if any(m == b or m.startswith(b + ".") for b in banned))
        for name, p in _modules().items()
        if name.startswith("qlower.lowerings.graph")
    }
    assert not {k: v for k, v in bad.items() if v}


def test_passes_take_from_emit_only_the_mx_readers():
    """The pass runs emitters through the registry alone (`Lowering.emit`); of emit/ it calls only the
    post-lowering MX reader fixes (emit/mx_readers.py). Its graph plumbing is lowerings/graph/'s."""
    bad = {
        name: sorted(
            m
            for m in _imports(p, False)
            if m.startswith("qlower.lowerings.emit") and not m.startswith("qlower.lowerings.emit.mx_readers")
        )
        for name, p in _modules().items()
        if name.startswith("qlower.passes")
    }
    assert not {k: v for k, v in bad.items() if v}


def test_nothing_inside_imports_the_public_api():
    """passes/, patterns/, lowerings/ never import the root package or qlower/'s public API modules."""
    mods = _modules()
    public = {n for n, p in mods.items() if p.parent == ROOT / "qlower"} | {"qlower"}
    bad = {
        name: sorted(m for m in _imports(p, False) if m in public)
        for name, p in mods.items()
        if not p.is_relative_to(ROOT / "qlower")
    }
    assert not {k: v for k, v in bad.items() if v}


def test_kernels_import_no_emit_and_no_devices():
    """Kernels are the bottom of lowerings/: nothing under qlower.lowerings.kernels imports emit/ (graph
    editing) or devices/ (which kernel serves which device), lazy imports included. Within the Triton kernels,
    the families' folders (int8/, mx/) import each other's modules nowhere: what both use is at the top."""
    mods = _modules()
    banned = ("qlower.lowerings.emit", "qlower.lowerings.devices")
    bad = {
        name: sorted(m for m in _imports(p, False) if any(m == b or m.startswith(b + ".") for b in banned))
        for name, p in mods.items()
        if name.startswith("qlower.lowerings.kernels")
    }
    assert not {k: v for k, v in bad.items() if v}
    fams = ("qlower.lowerings.kernels.triton.int8", "qlower.lowerings.kernels.triton.mx")
    crossing = {
        name: sorted(m for m in _imports(p, False) if m.startswith(other + ".") or m == other)
        for name, p in mods.items()
        for own, other in (fams, fams[::-1])
        if name == own or name.startswith(own + ".")
    }
    assert not {k: v for k, v in crossing.items() if v}


def _cycles(mods: dict[str, Path], top: str) -> list[list[str]]:
    """Import cycles among `mods` (modules of package `top`), lazy (function-level) imports included."""
    graph = {n: {m for m in _imports(p, False, top) if m in mods and m != n} for n, p in mods.items()}
    # a package's own __init__ importing its submodules is not a cycle through them
    for n in graph:
        graph[n] = {m for m in graph[n] if not n.startswith(m + ".")}
    state: dict[str, int] = {}
    cycles = []

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m) :] + [m] if m in stack else [n, m])
            elif m not in state:
                visit(m, [*stack, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return cycles


def test_no_import_cycles():
    """Lazy (function-level) imports count: a cycle through one is still two modules that need each other."""
    cycles = _cycles(_modules(), "qlower")
    assert not cycles, cycles


# ------------------------------------------------------------------------- scripts/ and tests/
SCRIPTS = ROOT / "scripts"
KERNELS = "qlower.lowerings.kernels"  # what the tuners and kernel benchmarks launch directly
MAX_SCRIPT_LINES = 800
# import-path edits and modules loaded from a file path: scripts/ and tests/ are packages of the repository
# root (pytest: pyproject.toml's `pythonpath`; scripts: `python -m scripts.<name>`), imported by their names
PATH_HACK = re.compile(
    r"sys\.path\.(insert|append|extend|remove)\(|sys\.path\s*(\[.*\]\s*)?(=|\+=)[^=]|site\.addsitedir"
    r"|spec_from_file_location|SourceFileLoader|machinery\.\w+Loader|run_path\(|load_source\("
)
ENTRY_PRELUDE = 'if __name__ == "__main__" and not __package__:'


def _script_modules() -> dict[str, Path]:
    out = {}
    for path in SCRIPTS.rglob("*.py"):
        parts = ["scripts", *path.relative_to(SCRIPTS).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_scripts_and_tests_load_no_module_by_path():
    """No import-path edits and no module loaded from a file path anywhere in scripts/ or tests/ (the
    subprocess scripts tests write included): everything imports by its package name from the repository
    root."""
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for folder in (SCRIPTS, ROOT / "tests")
        for path in sorted(folder.rglob("*.py"))
        if path != Path(__file__).resolve()  # this file: the pattern itself
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if PATH_HACK.search(line)
    ]
    assert not found, "\n".join(found)


def test_no_import_cycles_among_scripts():
    """scripts/ modules import each other without a cycle (lazy and TYPE_CHECKING imports count), and take
    from tests/ its model forms alone (`tests.forms`), never a test module or a test helper."""
    mods = _script_modules()
    cycles = _cycles(mods, "scripts")
    assert not cycles, cycles
    from_tests = {
        name: sorted(
            m for m in _imports(p, False, "tests") if m != "tests.forms" and not m.startswith("tests.forms.")
        )
        for name, p in mods.items()
    }
    assert not {k: v for k, v in from_tests.items() if v}


def test_no_script_file_over_the_line_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in SCRIPTS.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_SCRIPT_LINES
    }
    assert not long, f"over {MAX_SCRIPT_LINES} lines: {long}"


def test_entry_points_run_as_modules_and_as_files():
    """The top-level modules of scripts/ are its entry points (library code lives in its sub-packages): each
    runs as `python -m scripts.<name>`, and run as a file (`python scripts/<name>.py`: scripts/ alone on the
    import path) it first runs itself again that way, before it imports anything of scripts/ or tests/."""
    bad = []
    for path in sorted(SCRIPTS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        at = text.find(ENTRY_PRELUDE)
        again = f'[sys.executable, "-m", "scripts.{path.stem}", *sys.argv[1:]]'
        first_local = re.search(r"^(from|import) (scripts|tests)\b", text, re.M)
        if at < 0 or again not in text[at : at + 400] or (first_local and first_local.start() < at):
            bad.append(path.name)
        elif 'if __name__ == "__main__":' not in text[at + len(ENTRY_PRELUDE) :]:
            bad.append(f"{path.name}: no main")
    assert not bad, bad


def test_scripts_take_the_public_api_and_the_kernels():
    """scripts/ import qlower's public API (the root package and qlower/*.py modules) and, for the tuners and
    the kernel benchmarks, the kernels (qlower.lowerings.kernels); never the patterns, the passes, the rules
    (devices/) or the emitters."""
    mods = _modules()
    public = {n for n, p in mods.items() if p.parent == ROOT / "qlower"} | {"qlower"}
    bad = {}
    for path in SCRIPTS.rglob("*.py"):
        inner = sorted(
            m
            for m in _imports(path, False)
            if m not in public
            and not _is_public_attr(m, public)
            and not (m == KERNELS or m.startswith(KERNELS + "."))
        )
        if inner:
            bad[str(path.relative_to(SCRIPTS))] = inner
    assert not bad


def _is_public_attr(name: str, public: set[str]) -> bool:
    """`from qlower.quantize import mx_format` lists qlower.quantize.mx_format: a name of a public module."""
    parent = name.rsplit(".", 1)[0]
    return parent in public


def test_public_api_imports_no_package_at_module_level():
    """qlower/__init__.py binds its public names on first use (PEP 562): importing it imports no package."""
    assert not _imports(ROOT / "qlower" / "__init__.py", top_level_only=True)


def test_checkout_root_on_the_path_imports_the_sub_packages():
    """With the checkout's root first on sys.path (pytest's rootdir insertion, `python -P -m pytest` after a
    non-editable install), `qlower` is the root's qlower/ folder and its sub-packages still resolve to the
    root's passes/, patterns/ and lowerings/ folders."""
    script = (
        "import sys; sys.path[:0] = [sys.argv[1]]\n"
        "import importlib.util, qlower\n"
        "specs = [importlib.util.find_spec(f'qlower.{p}') for p in ('passes', 'patterns', 'lowerings')]\n"
        "print(qlower.__file__); print(*(s.origin for s in specs), sep='\\n')"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split()
    assert Path(lines[0]) == ROOT / "qlower" / "__init__.py"
    assert [Path(p) for p in lines[1:]] == [
        ROOT / f / "__init__.py" for f in ("passes", "patterns", "lowerings")
    ]


def _run_fresh(script: str) -> list[str]:
    """Run `script` in a fresh interpreter; the qlower modules it left loaded."""
    tail = (
        "\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'qlower')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script) + tail],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=ROOT / "tests",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["qlower", "qlower.patterns", "qlower.patterns.record"])
def test_public_api_and_patterns_import_alone(module):
    """Importing the public API (the `qlower` package) or the device-free patterns package loads nothing of
    the other packages: no lowering, pass, kernel or public API module (and so registers no backend, no torch
    op and no Inductor work-around)."""
    loaded = _run_fresh(f"import {module}")
    assert loaded and all(m == "qlower" or m.startswith("qlower.patterns") for m in loaded), loaded
    if module == "qlower":
        assert loaded == ["qlower"]


def test_public_names_resolve_on_first_use():
    loaded = _run_fresh(
        """
        import qlower
        assert set(qlower.__all__) <= set(dir(qlower)), set(qlower.__all__) - set(dir(qlower))
        from qlower import QuantLinear, inductor_options, register_backend  # noqa: F401
        assert qlower.QuantLinear is QuantLinear and qlower.patterns.QuantLinear is QuantLinear
        assert all(getattr(qlower, name) is not None for name in qlower.__all__)
        try:
            qlower.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("qlower.no_such_name resolved")
        """
    )
    assert {"qlower.options", "qlower.passes", "qlower.lowerings"} <= set(loaded)


_REGISTRY_FIRST_USE = """
    import json, sys
    from qlower.lowerings import KernelPreference, Lowering, registry

    assert not registry._BACKENDS, registry._BACKENDS  # importing the registry registers nothing
    packages = (
        "qlower.lowerings.devices",
        "qlower.lowerings.emit",
        "qlower.lowerings.graph",
        "qlower.lowerings.kernels",
    )
    assert not [m for m in sys.modules if m.startswith(packages)]
    plugin = Lowering("plugin.first", "woq_int8", KernelPreference.EMULATED, lambda r: None, lambda g, r: None)
    FIRST_USE
    print(json.dumps({dev: [lw.name for lw in b.lowerings] for dev, b in registry.backends().items()}))
"""
BUILTIN_CPU_FIRST = "aten._weight_int8pack_mm"


@pytest.mark.parametrize(
    "first_use, devices, cpu_head",
    [
        ("registry.backends()", ["cpu", "cuda", "xpu"], [BUILTIN_CPU_FIRST]),
        (
            'registry.register_backend("cpu", [plugin])',
            ["cpu", "cuda", "xpu"],
            ["plugin.first", BUILTIN_CPU_FIRST],
        ),
        (
            'registry.register_backend("cpu", [plugin], replace=True)',
            ["cpu", "cuda", "xpu"],
            ["plugin.first"],
        ),
        ('registry.unregister_backend("xpu")', ["cpu", "cuda"], [BUILTIN_CPU_FIRST]),
    ],
    ids=["lookup", "register", "replace", "unregister"],
)
def test_registry_registers_nothing_until_first_use(first_use, devices, cpu_head):
    """The built-in backends load at the registry's first use, whichever call it is, so a plugin registered
    before any compile ranks ahead of them, `replace=True` drops them and `unregister_backend` keeps them out,
    exactly as when they loaded at import."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_REGISTRY_FIRST_USE.replace("FIRST_USE", first_use))],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=ROOT / "tests",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    registered = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(registered) == devices
    cpu = registered["cpu"]
    assert cpu[: len(cpu_head)] == cpu_head and (len(cpu) == 1) == (cpu_head == ["plugin.first"]), cpu
