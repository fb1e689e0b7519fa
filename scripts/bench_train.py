"""Training-step benchmark for MX: a Llama-style stack trained end to end, bf16 against torchao's MX recipe.

    python -m scripts.bench_train --device cuda [--variants bf16,mx:stock,mx:qlower] [--steps 20] [--out DIR]
    python -m scripts.bench_train --small        (CPU smoke: dim 128, one layer, a few steps)

Each variant trains the same model (seed 0) on the same data with AdamW for `--steps` steps:
    bf16        nn.Linear in bf16, stock torch.compile
    mx:eager    torchao's MXFP8Linear (`kernel_preference=EMULATED`: the MX recipe on GPUs without MX tensor
                cores, and on CPU) in eager mode: the loss reference
    mx:stock    the same model under stock torch.compile
    mx:qlower   the same model under torch.compile with qlower.inductor_options() (AUTO: on CUDA a training
                compile's MX linears stay stock's, `devices/cuda.py::_prefer_mx_emulated`)
    mx:qlower-emulated   the same with kernel_preference="EMULATED": qlower's exact MX emulation lowers them
Rows: compile seconds (the first step's wall time), step time (median of the steps after `--warmup`, CUDA
synchronized), peak memory (CUDA), the loss after the last step and its relative difference from mx:eager's,
qlower's report (matmuls lowered / candidates). A variant that fails says so in its note; exit status 1 then.
Writes train_<device>.md / .json to `--out` (default `bench-out/`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_train", *sys.argv[1:]])

import torch
import torch.nn.functional as F
from torch import nn

import qlower
from scripts.common.meta import DEFAULT_OUT, describe_device, versions
from scripts.decoder.model import TP, Block, Config, rms_norm, split_heads

DTYPE = torch.bfloat16
VARIANTS = ("bf16", "mx:eager", "mx:stock", "mx:qlower", "mx:qlower-emulated")
FULL = dataclasses.replace(Config(), layers=2)  # the Llama-3-8B layer shapes
SMALL = Config(dim=128, heads=4, kv_heads=2, hidden=256, layers=1)
LOSS_TOL = 1e-2  # relative difference of the final loss from mx:eager's


class TrainBlock(Block):
    """bench_model's Llama block (its layers and weights) without a KV cache: causal attention over the sequence."""

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg, TP())

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        cfg, hd = self.cfg, self.cfg.head_dim
        q, k, v = split_heads(
            self.qkv(rms_norm(x, self.attn_norm, cfg.eps)), cfg.heads, cfg.kv_heads, hd, cos, sin
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, cfg.heads * hd))
        gate, up = self.gate_up(rms_norm(x, self.ffn_norm, cfg.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TrainStack(nn.Module):
    def __init__(self, cfg: Config, seq: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TrainBlock(cfg) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.eps = cfg.eps
        inv = 1.0 / cfg.rope_base ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        angles = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.layers:
            x = blk(x, self.cos, self.sin)
        return rms_norm(x, self.norm, self.eps)


def build(cfg: Config, seq: int, device: str, mx: bool) -> nn.Module:
    """The model every variant trains (seed 0), with each nn.Linear swapped for torchao's MXFP8Linear when `mx`."""
    torch.manual_seed(0)
    model = TrainStack(cfg, seq)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
    if mx:
        from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        for blk in model.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                lin = getattr(blk, name)
                mxl = MXFP8Linear(lin.in_features, lin.out_features, bias=False,
                                  kernel_preference=KernelPreference.EMULATED)  # fmt: skip
                with torch.no_grad():
                    mxl.weight.copy_(lin.weight)
                setattr(blk, name, mxl)
    return model.to(device=device, dtype=DTYPE)


def batches(
    cfg: Config, batch: int, seq: int, steps: int, device: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input hidden states, regression target) per step, the same for every variant."""
    g = torch.Generator(device=device).manual_seed(1)
    shape = (batch, seq, cfg.dim)
    return [
        (torch.randn(shape, generator=g, device=device, dtype=DTYPE), torch.randn(shape, generator=g, device=device, dtype=DTYPE))
        for _ in range(steps)
    ]  # fmt: skip


@dataclasses.dataclass
class Row:
    variant: str
    compile_s: float | None = None
    step_s: float | None = None
    peak_mib: float | None = None
    loss: float | None = None
    loss_vs_eager: float | None = None
    vs_bf16: float | None = None
    lowered: str = ""
    note: str = ""


def run_variant(variant: str, args: argparse.Namespace, data: list) -> Row:
    row = Row(variant)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = build(args.cfg, args.seq, args.device, mx=variant.startswith("mx"))
    if variant in ("bf16", "mx:stock"):
        fwd: Callable = torch.compile(model)
    elif variant == "mx:qlower":
        fwd = torch.compile(model, options=qlower.inductor_options())
    elif variant == "mx:qlower-emulated":
        fwd = torch.compile(model, options=qlower.inductor_options(kernel_preference="EMULATED"))
    else:
        fwd = model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    torch._dynamo.reset()
    qlower.clear_reports()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for i, (x, y) in enumerate(data):
        sync()
        t0 = time.perf_counter()
        loss = F.mse_loss(fwd(x).float(), y.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        if i == 0 and fwd is not model:
            row.compile_s = dt
        elif i > args.warmup:
            times.append(dt)
    row.step_s = statistics.median(times) if times else None
    row.loss = float(loss) if loss is not None else None
    row.peak_mib = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    if variant.startswith("mx:qlower"):
        rows = [d for rep in qlower.all_reports() for d in rep if d.family == "mx"]
        row.lowered = f"{sum(d.lowered for d in rows)}/{len(rows)} lowered"
        if any(not d.lowered for d in rows):
            row.note = "left alone: " + "; ".join(sorted({d.short_reason for d in rows if not d.lowered}))
    return row


def table(rows: list[Row]) -> str:
    def f(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "—"

    out = ["| variant | compile s | step | × bf16 | peak MiB | loss | vs mx:eager | qlower | note |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        step = f"{r.step_s * 1e3:.1f} ms" if r.step_s else "—"
        out.append(f"| {r.variant} | {f(r.compile_s, '.1f')} | {step} | {f(r.vs_bf16, '.2f')} | {f(r.peak_mib, '.0f')} | "
                   f"{f(r.loss, '.5f')} | {f(r.loss_vs_eager, '.1e')} | {r.lowered} | {r.note} |")  # fmt: skip
    return "\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda")
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument(
        "--small", action="store_true", help="dim 128, one layer, 2 x 64 tokens (automatic on CPU)"
    )
    p.add_argument("--layers", type=int, default=None, help="blocks (default 2; small 1)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 4; small 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 2048; small 64)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 20; small 4)")
    p.add_argument(
        "--warmup", type=int, default=2, help="steps after the compile step left out of the median"
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args(argv)
    args.argv = argv
    small = args.small or args.device == "cpu"
    cfg = SMALL if small else FULL
    args.cfg = dataclasses.replace(cfg, layers=args.layers or cfg.layers)
    args.batch = args.batch or (2 if small else 4)
    args.seq = args.seq or (64 if small else 2048)
    args.steps = args.steps or (4 if small else 20)
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}; choose from {', '.join(VARIANTS)}")
    if args.steps <= args.warmup + 1:
        p.error("--steps must exceed --warmup + 1 (the compile step and the warm-up steps are not timed)")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    data = batches(args.cfg, args.batch, args.seq, args.steps, args.device)
    rows = []
    for variant in args.variants:
        try:
            rows.append(run_variant(variant, args, data))
        except Exception as e:  # one variant's failure is a row, not the end of the run
            traceback.print_exc()
            rows.append(Row(variant, note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"))
        torch._dynamo.reset()
    by = {r.variant: r for r in rows}
    for r in rows:
        if by.get("bf16") and by["bf16"].step_s and r.step_s:
            r.vs_bf16 = by["bf16"].step_s / r.step_s
        if by.get("mx:eager") and by["mx:eager"].loss and r.loss is not None and r.variant.startswith("mx"):
            r.loss_vs_eager = abs(r.loss - by["mx:eager"].loss) / abs(by["mx:eager"].loss)
            if r.loss_vs_eager > LOSS_TOL:
                r.note = (r.note + "; " if r.note else "") + f"loss differs from mx:eager's by > {LOSS_TOL}"
    meta = {
        "device": describe_device(args.device),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        **versions(),
        "command": "python -m scripts.bench_train " + " ".join(args.argv),
        "config": dataclasses.asdict(args.cfg),
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "timing": "median wall time per step (forward, backward, AdamW), CUDA synchronized; compile s: the first step",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = " · ".join(f"{k} {v}" for k, v in meta.items() if k != "config")
    text = f"{header}\n\nconfig: {meta['config']}\n\n{table(rows)}\n"
    (out / f"train_{args.device}.md").write_text(text)
    data_out = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]}
    (out / f"train_{args.device}.json").write_text(json.dumps(data_out, indent=1))
    print(text)
    return 1 if any(r.note for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
