"""The public API as a newcomer meets it: report rows, the CLI, torchao's KernelPreference, the demo's MX
linear.

- A report row names its source module (the innermost entry of Dynamo's `nn_module_stack`, as a qualified
  name), prints a symbolic M as its range, and shows one short reason; the whole text is on demand.
- `python -m qlower --version`; a request the machine cannot serve is one line on stderr and exit status 2.
- `qlower.KernelPreference` accepts torchao's members where they mean the same thing.
- `python -m qlower demo` shows an MX linear too.
"""

from __future__ import annotations

import enum
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import qlower
from qlower import demo
from qlower.__main__ import main as cli_main
from qlower.lowerings.preference import TORCHAO_EQUIVALENTS, parse_preference
from qlower.passes.report import REASON_WIDTH, Decision, Report, module_of, short_reason
from tests.forms.woq_int8 import WoqLinear
from tests.helpers import SUBPROCESS_TIMEOUT_S

F32 = torch.float32
KP = qlower.KernelPreference


# ------------------------------------------------------------------------------------- report: module names
class _Attention(nn.Module):
    """q_proj's result goes through the attention's own head split: the record's output is a view of the
    parent's code, its matmul is q_proj's."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = WoqLinear(64, 64, F32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x).view(x.shape[0], 4, 16).transpose(0, 1)
        return q.transpose(0, 1).reshape(x.shape[0], 64)


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down_proj = WoqLinear(64, 64, F32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(x))


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.mlp = _Attention(), _MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.self_attn(x))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer() for _ in range(2)])
        self.heads = nn.ModuleDict({"lm": WoqLinear(64, 48, F32)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.heads["lm"](x)


MODULES = [
    "layers.0.self_attn.q_proj",
    "layers.0.mlp.down_proj",
    "layers.1.self_attn.q_proj",
    "layers.1.mlp.down_proj",
    "heads.lm",
]


def _compile_net(dynamic: bool, sizes: tuple[int, ...]) -> Report:
    model = _Net().requires_grad_(False)
    fn = torch.compile(model, dynamic=dynamic, options=qlower.inductor_options())
    with torch.no_grad():
        for m in sizes:
            x = torch.randn(m, 64)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    return qlower.last_report()


def test_report_rows_name_their_source_module():
    report = _compile_net(dynamic=False, sizes=(3,))
    assert [d.module for d in report] == MODULES, report.table()
    table = report.table()
    head = table.splitlines()[1]
    assert head.split()[:3] == ["#", "module", "family"], table
    for i, name in enumerate(MODULES):
        assert re.search(rf"^{i}\s+{re.escape(name)}\s+woq_int8", table, re.M), table


def test_symbolic_m_prints_as_its_range():
    report = _compile_net(dynamic=True, sizes=(3, 5))
    assert len(report) == 5 and all(isinstance(d.shape[0], torch.SymInt) for d in report), report.table()
    assert [d.module for d in report] == MODULES, report.table()
    assert {d.shape_text for d in report} == {"2..inf, 64, 64", "2..inf, 64, 48"}, report.table()
    shapes = [line.split()[4] for line in report.table().splitlines()[3:] if re.match(r"\d", line)]
    assert shapes and all(s == "2..inf," for s in shapes), report.table()
    assert not re.search(r"\bs\d+\b", report.table()), report.table()  # no bare `s81`
    explained = report.explain(0)
    assert re.search(r"M, K, N:\s+2\.\.inf, 64, 64 \(M = s\d+\)", explained), explained


def test_backward_rows_name_the_forward_module():
    class _Trainable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = WoqLinear(64, 48, F32)
            self.f = nn.Linear(48, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.f(self.q(x))

    fn = torch.compile(_Trainable(), options=qlower.inductor_options())
    fn(torch.randn(4, 64, requires_grad=True)).sum().backward()
    report = qlower.last_report()
    assert len(report) == 2 and [d.module for d in report] == ["q", "q"], report.table()


def test_module_of_reads_dynamos_spellings():
    g = fx.Graph()
    spellings = {
        "L['self'].layers[3].mlp.down_proj": "layers.3.mlp.down_proj",
        "L['self']._modules['layers']._modules['3']": "layers.3",
        "L['args'][0].model.layers.0.self_attn.q_proj": "model.layers.0.self_attn.q_proj",  # transformers
        "getattr(L['self'].layers, '2').mlp": "layers.2.mlp",
        "L['fn'].0": "0",
        "G['model'].heads['lm']": "heads.lm",
        "L['self']": "<_Net>",  # the compiled module itself
    }
    for path, want in spellings.items():
        node = g.placeholder(f"x{len(g.nodes)}")
        node.meta["nn_module_stack"] = {"root": ("L['self']", _Net), "inner": (path, _Net)}
        assert module_of(node) == want, path
    bare = g.placeholder("bare")
    assert module_of(bare) == ""
    bw = g.placeholder("bw")
    bw.meta["fwd_nn_module_stack"] = {"a": ("L['self'].q", WoqLinear)}
    assert module_of(bw) == "q"


def test_a_row_without_a_module_prints_a_dash():
    report = Report("0/0", [Decision("woq_int8", "cpu", (1, 16, 16), "torch.bfloat16", "dequant_mm", None)])
    row = report.table().splitlines()[3]
    assert row.split()[:3] == ["0", "-", "woq_int8"], report.table()


# ----------------------------------------------------------------------------------- report: short reasons
PASSED = (
    ("aten._weight_int8pack_mm", "M=6 > 1: dequant + GEMM is faster on CPU"),
    ("qlower.woq_int8_mm_by_m", "M is static (decided at compile time)"),
    ("qlower.int8_weight_mm", "the float weight (0 MiB) is < 16 MiB: Inductor's fused dequant is as fast"),
)
WHY = "AUTO #4: fused int8->float dequant + float GEMM, the scale where the graph puts it (weight or result)"
VERY_LONG = "x: " + "a very long single clause " * 8


def test_table_shows_one_short_reason_and_the_whole_text_on_demand():
    """A lowered row's "why" is the choice's own reason, never the lowerings passed over (those are data,
    printed by `explain`); a left-alone row's is why it was left alone, its first clause in the table."""
    rows = [
        Decision(
            "woq_int8", "cpu", (6, 64, 64), "torch.float32", "dequant_mm", None, "EMULATED", "mm", "mul",
            why=WHY, passed_over=PASSED,
        ),
        Decision("mx", "cpu", (2, 64, 64), "torch.bfloat16", None, VERY_LONG, node="mm_3", module="a.b"),
    ]  # fmt: skip
    report = Report("0/0", rows)
    short = report.table()
    assert WHY[:40] in short and "(reasons shortened" in short
    assert not any(name in short for name, _ in PASSED), short  # the passed-over list only on demand
    assert max(len(d.short_reason) for d in rows) <= REASON_WIDTH
    assert short_reason(VERY_LONG).endswith("...") and short_reason(None) == ""
    assert str(report) == short
    full = report.table(full=True)
    assert WHY in full and VERY_LONG.strip() in full and "(reasons shortened" not in full
    explained = report.explain(0)
    assert f"chosen:   {WHY}" in explained
    for name, why in PASSED:
        assert f"  - {name}: {why}" in explained, explained
    assert "lowering: dequant_mm (kind EMULATED)" in explained and "node:     mul" in explained
    assert report.explain(rows[1]).startswith("module:   a.b") and "left alone because" in report.explain(1)
    # The fields a Decision had keep their names and positions.
    d = rows[0]
    assert (d.family, d.device, d.shape, d.dtype, d.lowering, d.reason, d.kind, d.form, d.node) == (
        "woq_int8", "cpu", (6, 64, 64), "torch.float32", "dequant_mm", None, "EMULATED", "mm", "mul",
    )  # fmt: skip
    assert d.passed_over_text.startswith("aten._weight_int8pack_mm: M=6 > 1")


def test_short_reasons_need_no_note():
    report = Report("0/0", [Decision("woq_int8", "cpu", (1, 16, 16), "torch.float32", "x", "short")])
    assert "(reasons shortened" not in report.table()


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_:
        cli_main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"qlower {metadata.version('qlower')}"


def test_cli_version_falls_back_to_the_package_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    from qlower import __main__ as cli

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert cli.version() == qlower.__version__


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no CUDA device")
def test_cli_demo_on_a_missing_device_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m qlower demo: --device cuda: ") and "--device cpu" in err, err


def test_cli_value_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--device", "bogus"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'bogus' names no torch device" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no CUDA device")
def test_cli_demo_on_a_missing_device_prints_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qlower", "demo", "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert [line for line in proc.stderr.splitlines() if line.startswith("python -m qlower demo:")], (
        proc.stderr
    )


# ------------------------------------------------------------------------------ torchao's KernelPreference
@pytest.fixture(scope="module")
def torchao_kp():
    kernel_preference = pytest.importorskip("torchao.quantization.quantize_.common.kernel_preference")
    return kernel_preference.KernelPreference


def test_preference_accepts_torchaos_members_that_mean_the_same(torchao_kp):
    want = {"AUTO": KP.AUTO, "TORCH": KP.ATEN, "TRITON": KP.TRITON, "EMULATED": KP.EMULATED}
    assert dict(TORCHAO_EQUIVALENTS) == want
    for name, ours in want.items():
        member = torchao_kp[name]
        assert parse_preference(member) is ours
        assert parse_preference(name) is ours and parse_preference(name.lower()) is ours
        qpass = qlower.inductor_options(kernel_preference=member)["joint_custom_pre_pass"]
        assert qpass.preference is ours


def test_preference_refuses_torchaos_members_without_a_counterpart(torchao_kp):
    others = [m for m in torchao_kp if m.name not in TORCHAO_EQUIVALENTS]
    assert others, "torchao has kernel preferences qlower has no kernels for (MSLK in torchao 0.18)"
    for member in others:
        with pytest.raises(ValueError) as err:
            parse_preference(member)
        msg = str(err.value)
        assert f"KernelPreference.{member.name}" in msg and "TORCH->ATEN" in msg, msg
        assert "AUTO, ATEN, TRITON, EMULATED" in msg, msg
    for text in ("mslk", "FBGEMM"):
        with pytest.raises(ValueError, match="torchao's KernelPreference.*TORCH->ATEN"):
            parse_preference(text)


def test_preference_refuses_an_older_torchaos_fbgemm():
    """torchao before 0.18 had FBGEMM: any member of a `torchao` KernelPreference without a counterpart."""

    class KernelPreference(str, enum.Enum):
        AUTO = "auto"
        FBGEMM = "fbgemm"

    KernelPreference.__module__ = "torchao.quantization.quantize_.common.kernel_preference"
    assert parse_preference(KernelPreference.AUTO) is KP.AUTO
    with pytest.raises(ValueError, match="KernelPreference.FBGEMM.*qlower's choices: AUTO, ATEN"):
        parse_preference(KernelPreference.FBGEMM)


def test_preference_docstring_names_the_mapping():
    doc = parse_preference.__doc__ or ""
    for torchao_name, ours in TORCHAO_EQUIVALENTS.items():
        assert re.search(rf"^\s+{torchao_name}\s+{ours.name}\s", doc, re.M), torchao_name
    assert "MSLK" in doc and "FBGEMM" in doc


# ------------------------------------------------------------------------------------------- demo: MX
def test_demo_mx_linear_is_lowered_and_named():
    r = demo.run_mx("cpu")
    assert r.lowered, r.report.table()
    (d,) = r.report
    assert d.family == "mx" and d.module == "proj" and d.shape == demo.MX_SHAPE, r.report.table()
    assert r.err_vs_eager <= 2**-7 * r.ref_max, (r.err_vs_eager, r.ref_max)


class _BmmWoq(nn.Module):
    """A woq-int8 linear Inductor sees as bmm, which canonicalization turns into mm: an einsum of 2-D operands
    (a batch-1 bmm), or a weight expanded over the batch."""

    def __init__(self, seed: int, einsum: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.einsum = einsum
        self.register_buffer("w", torch.randint(-127, 128, (24, 32), dtype=torch.int8, generator=g))
        self.register_buffer("s", torch.rand(24, generator=g) / 64 + 1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.to(x.dtype)
        if self.einsum:
            return (
                torch.einsum("mk,nk->mn", x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], -1) * self.s
            )
        return torch.bmm(x, w.t().expand(x.shape[0], -1, -1)) * self.s


class _BmmNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flat = _BmmWoq(3, einsum=True)
        self.batched = _BmmWoq(4, einsum=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.flat(x) + self.batched(x)


@pytest.mark.parametrize("dynamic", [False, True])
def test_canonicalized_linear_keeps_its_module(dynamic: bool):
    model = _BmmNet()
    fn = torch.compile(model, dynamic=dynamic, options=qlower.inductor_options())
    with torch.no_grad():
        for x in (torch.randn(2, 3, 32), torch.randn(3, 5, 32))[: 1 + dynamic]:
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    report = qlower.last_report()
    assert sorted(d.module for d in report) == ["batched", "flat"], report.table()
    assert all(d.lowered and d.family == "woq_int8" for d in report), report.table()


def test_cli_build_without_a_toolchain_is_one_line(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m qlower build` where nvcc or CUTLASS is missing: one line naming the extra to install."""
    from qlower.lowerings.kernels.cutlass import build

    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    assert cli_main(["build"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m qlower build: nvcc") and "qlower[cuda]" in err, err


def test_cli_build_prints_the_library_and_copies_it(monkeypatch, tmp_path, capsys) -> None:
    """The ahead-of-time build: the library's path as the environment line that serves it elsewhere, and with
    --out a copy there (the nvcc build itself is stubbed: tests/lowerings/kernels/test_cutlass_w8a16.py
    compiles the source)."""
    from qlower.lowerings.kernels.cutlass import build

    lib = tmp_path / "cache" / build.LIBRARY_NAME
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(build, "toolchain", lambda: build.Toolchain(tmp_path / "nvcc", (tmp_path,)))
    monkeypatch.setattr(build, "build", lambda tc, jobs=None, log=None: lib)
    assert cli_main(["build", "--out", str(tmp_path / "deploy")]) == 0
    copied = tmp_path / "deploy" / build.LIBRARY_NAME
    assert copied.read_bytes() == b"\x7fELF"
    assert capsys.readouterr().out.strip().endswith(f"QLOWER_CUTLASS_LIBRARY={copied}")
