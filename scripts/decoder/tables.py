"""bench_model.py's rows and what is written from them: the side-by-side tables (.md), every field (.json)
and the speedup plot (.png)."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlower.timing import LoadWatch, format_spread, stability_warning


@dataclass
class Row:
    variant: str
    workload: str
    mode: str  # static | changing | dynamic
    cudagraphs: bool
    tp: int
    batch: int
    tokens_per_step: int
    seconds: float | None = None  # median per step
    min_seconds: float | None = None
    spread: float | None = None  # IQR / median of the timed steps (qlower.timing); None in older JSON
    reps: int = 0
    tokens_per_s: float | None = None
    vs_bf16: float | None = None
    weight_bytes: int = 0
    hbm_bound: float | None = None  # weight bytes / HBM bandwidth, over the step time (CUDA)
    gpu_matmul_s: float | None = None  # --kernel-split: matmul kernels' GPU time per step
    gpu_other_s: float | None = None  # --kernel-split: every other kernel's GPU time per step
    rel_err: float | None = None
    graphs_compiled: int = (
        0  # Dynamo graphs this row's calls compiled (0: an earlier workload's graph served)
    )
    compile_s: float | None = None  # wall seconds of the call that compiled (None: no compile in this row)
    lowered: int | None = None  # qlower rows: linears lowered / candidates
    linears: int | None = None
    kernels: str = ""
    reasons: list[str] = field(default_factory=list)  # full reason of every linear left alone
    note: str = ""


def timing_warning(rows: list[Row], watch: LoadWatch | None) -> str | None:
    """bench_model's WARNING line (qlower.timing.stability_warning) over every timed row."""
    spreads = {
        f"{r.variant} {r.workload} {r.mode}" + (" graphs" if r.cudagraphs else ""): r.spread
        for r in rows
        if r.spread is not None
    }
    return stability_warning(spreads, watch.peak if watch is not None else None)


def fill_ratios(rows: list[Row]) -> None:
    base = {(r.workload, r.mode, r.cudagraphs, r.tp): r.seconds for r in rows if r.variant == "bf16"}
    for r in rows:
        b = base.get((r.workload, r.mode, r.cudagraphs, r.tp))
        r.vs_bf16 = b / r.seconds if b and r.seconds else None


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _fmt_step(r: Row) -> str:
    """The median step and, when measured, its spread: `1.23 ms ±4%`."""
    return _fmt_time(r.seconds) + ("" if r.spread is None else " " + format_spread(r.spread))


def combo_name(mode: str, graphs: bool) -> str:
    return f"{mode} shapes, CUDA graphs {'on' if graphs else 'off'}"


def table(rows: list[Row]) -> str:
    """Side by side (one row per workload, one column per variant: time and ratio to bf16) for each shape mode
    and graphs setting, then every field of every row."""
    variants = list(dict.fromkeys(r.variant for r in rows))
    out = []
    for mode, graphs in dict.fromkeys((r.mode, r.cudagraphs) for r in rows):
        sub = [r for r in rows if (r.mode, r.cudagraphs) == (mode, graphs)]
        out += [f"### {combo_name(mode, graphs)}", "", "| workload | " + " | ".join(variants) + " |"]
        out.append("|---|" + "---|" * len(variants))
        for wl in dict.fromkeys(r.workload for r in sub):
            by_v = {r.variant: r for r in sub if r.workload == wl}
            cells = []
            for v in variants:
                r = by_v.get(v)
                if r is None or r.seconds is None:
                    cells.append("failed" if r is not None else "—")
                else:
                    ratio = f" ({r.vs_bf16:.2f}×)" if v != "bf16" and r.vs_bf16 else ""
                    cells.append(_fmt_step(r) + ratio)
            out.append(f"| {wl} | " + " | ".join(cells) + " |")
        out.append("")
    split = any(r.gpu_matmul_s is not None for r in rows)
    split_head = ["GPU: matmuls", "GPU: other", "HBM bound / matmuls"] if split else []
    head = [
        "variant",
        "workload",
        "shapes",
        "graphs",
        "step",
        "tokens/s",
        "vs bf16",
        "HBM bound",
        *split_head,
        "compiles",
        "compile s",
        "qlower",
        "note",
    ]
    out += ["### every row", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        q = f"{r.lowered}/{r.linears} lowered: {r.kernels}" if r.linears is not None else ""
        cells = [
            r.variant,
            r.workload,
            r.mode,
            "on" if r.cudagraphs else "off",
            _fmt_step(r),
            f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "—",
            f"{r.vs_bf16:.2f}×" if r.vs_bf16 else "—",
            f"{r.hbm_bound:.2f}" if r.hbm_bound is not None else "—",
            *(_split_cells(r) if split else []),
            str(r.graphs_compiled),
            f"{r.compile_s:.1f}" if r.compile_s is not None else "—",
            q,
            r.note.replace("|", "/"),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _split_cells(r: Row) -> list[str]:
    if r.gpu_matmul_s is None or r.gpu_other_s is None:
        return ["—", "—", "—"]
    bound = r.hbm_bound * r.seconds / r.gpu_matmul_s if r.hbm_bound and r.seconds and r.gpu_matmul_s else None
    return [_fmt_time(r.gpu_matmul_s), _fmt_time(r.gpu_other_s), f"{bound:.2f}" if bound else "—"]


def plot(rows: list[Row], title: str, path: Path) -> Path | None:
    """PNG: speedup vs bf16 per workload, one panel per shape mode and graphs setting, one line per variant."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("bench_model: matplotlib is not installed (pip install -e '.[test]'): no plot", file=sys.stderr)
        return None
    combos = list(dict.fromkeys((r.mode, r.cudagraphs) for r in rows))
    fig, axes = plt.subplots(1, len(combos), figsize=(5.5 * len(combos), 4.2), squeeze=False)
    for ax, (mode, graphs) in zip(axes[0], combos, strict=True):
        sub = [r for r in rows if (r.mode, r.cudagraphs) == (mode, graphs)]
        wls = list(dict.fromkeys(r.workload for r in sub))
        for v in dict.fromkeys(r.variant for r in sub if r.variant != "bf16"):
            pts = [(wls.index(r.workload), r.vs_bf16) for r in sub if r.variant == v and r.vs_bf16]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.axhline(1.0, color="gray", linestyle="--", label="bf16 compiled")
        ax.set_xticks(range(len(wls)), wls, rotation=30)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.set_ylabel("speedup vs bf16 compiled")
        ax.set_title(combo_name(mode, graphs), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write(out: Path, meta: dict[str, Any], rows: list[Row], with_plot: bool = True) -> str:
    stem = out / (f"model_{meta['device_kind']}" + (f"_tp{meta['tp']}" if meta["tp"] > 1 else ""))
    skip = ("config", "rank", "device_kind", "warning")
    header = " · ".join(f"{k} {v}" for k, v in meta.items() if k not in skip and v is not None)
    warning = f"\n\n{meta['warning']}" if meta.get("warning") else ""
    text = f"{header}{warning}\n\nconfig: {meta['config']}\n\n{table(rows)}"
    out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(text + "\n")
    data = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    c = meta["config"]
    shape = f"{c['layers']} layers, dim {c['dim']}, cache {meta['cache']}, TP {meta['tp']}"
    title = f"{shape} · {meta['device']} · torch {meta['torch']} · {meta['date']}"
    png = plot(rows, title, stem.with_suffix(".png")) if with_plot else None
    return text + f"\n\nwrote {stem}.md, {stem}.json" + (f", {png}" if png else "")


def renamed_keys(row: dict[str, Any]) -> dict[str, Any]:
    """A row of an earlier run's JSON under today's field names (`hbm_floor` was `hbm_bound`'s old name)."""
    return {("hbm_bound" if k == "hbm_floor" else k): v for k, v in row.items()}
