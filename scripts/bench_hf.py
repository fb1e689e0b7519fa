"""HF `generate` as users run it: bf16, stock `torch.compile` and qlower side by side, per decoder and family.

    python scripts/bench_hf.py --small                  # CPU: a small Llama config, torchao woq-int8, dynamic cache
    python scripts/bench_hf.py --device cuda            # GPU: Llama-3-8B dims, 4 layers, vocab 128256
        [--archs llama,qwen2] [--families woq_int8,dynamic_int8] [--caches dynamic,static] [--batch 1]
        [--new-tokens 32] [--guards all|skip-nn-modules] [--layers 32] [--out DIR]

Models are built from configs (random weights, nothing downloaded), quantized with torchao's `quantize_`
(`Int8WeightOnlyConfig`, `Int8DynamicActivationInt8WeightConfig`). Three flows per row, in one process:
**bf16** (the unquantized model compiled by stock `torch.compile`: what a user would run instead), **stock**
(the quantized model compiled by stock `torch.compile`) and **qlower** (compiled with `qlower.inductor_options()`).
Two caches: `dynamic` (HF's default cache, `model.forward` compiled in place: docs/hf-generate.md's recipe)
and `static` (`cache_implementation="static"` with a `CompileConfig` holding the flow's options, so
transformers compiles the decode step; on CUDA under `mode="reduce-overhead"`, CUDA graphs).

Per flow: decode ms per token = (generate(N) - generate(1)) / (N - 1), so HF's own per-step host work counts as
a user pays it; the first call's seconds (compiles included); the CUDA allocator's peak memory (not measured on
CPU); and how many leading greedy tokens equal eager's from the same quantized (or bf16) model. Writes
`hf_<device>.md` and `.json` to `--out` (default `bench-out/`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_hf", *sys.argv[1:]])

import torch

import qlower

FLOWS = ("bf16", "stock", "qlower")
# qlower_unwrapped: the quantized model after torchao's `unwrap_tensor_subclass` (plain int8 and scale tensors
# behind a parametrization), so the compiled step takes plain tensors instead of flattening subclasses per call.
EXTRA_FLOWS = ("qlower_unwrapped",)
ROUNDS = 5  # timed rounds of generate(1) and generate(N); the minimum of each
SMALL = dict(
    hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8, vocab_size=4096
)
TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=1, num_attention_heads=4, vocab_size=256)
FULL = dict(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32, vocab_size=128256
)


@dataclass
class Row:
    arch: str
    family: str
    cache: str
    flow: str
    decode_ms: float
    first_call_s: float
    peak_mib: float | None  # CUDA only
    tokens_equal: int  # leading greedy tokens equal to eager's from the same (quantized or bf16) model
    lowered: str  # qlower: lowered / candidate linears over its reports


def build(arch: str, dims: dict[str, int], device: str) -> torch.nn.Module:
    import transformers

    common = dict(
        dims, num_key_value_heads=max(1, dims["num_attention_heads"] // 4), max_position_embeddings=512
    )
    classes = {
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
        "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
    }
    model_class, config_class = classes[arch]
    # Built on the device in bf16: a CPU fp32 init of the 128256-row vocab takes minutes.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = model_class(config_class(**common))
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def quantize(model: torch.nn.Module, family: str) -> torch.nn.Module:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    config = Int8WeightOnlyConfig() if family == "woq_int8" else Int8DynamicActivationInt8WeightConfig()
    quantize_(model, config)
    return model


def options(flow: str, device: str) -> dict[str, Any] | None:
    if not flow.startswith("qlower"):
        return None
    return qlower.inductor_options(mode="reduce-overhead") if device == "cuda" else qlower.inductor_options()


# --guards: Dynamo's guard filter for every flow (docs/hf-generate.md, "The guards on torchao weights")
GUARD_FILTERS = {"all": None, "skip-nn-modules": "skip_guard_on_all_nn_modules_unsafe"}


def prepare(
    model: torch.nn.Module, flow: str, cache: str, device: str, guards: str = "all"
) -> torch.nn.Module:
    """The flow's compiled copy, set up as docs/hf-generate.md's recipe for `cache` says."""
    import transformers

    model = copy.deepcopy(model)
    if flow.endswith("_unwrapped"):
        from torchao.utils import unwrap_tensor_subclass

        model = unwrap_tensor_subclass(model)
    opts = options(flow, device)
    if GUARD_FILTERS[guards] is not None:
        base = (
            opts
            if opts is not None
            else ({"triton.cudagraphs": True} if cache == "static" and device == "cuda" else {})
        )
        opts = {**base, "guard_filter_fn": getattr(torch.compiler, GUARD_FILTERS[guards])}
    if cache == "static":
        model.generation_config.cache_implementation = "static"
        # torch.compile takes a mode or options, not both: options carry the mode's settings (CUDA graphs)
        mode = "reduce-overhead" if device == "cuda" and opts is None else None
        model.generation_config.compile_config = transformers.CompileConfig(mode=mode, options=opts)
    else:
        model.forward = torch.compile(model.forward, options=opts)
    return model


def greedy(model: torch.nn.Module, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1] :]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def seconds(fn, device: str) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def leading_equal(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many leading tokens every sequence of the batch shares with eager's (random-weight models have
    near-tied logits: one rounding difference changes every later token)."""
    same = (got == want).all(0).to(torch.int64)
    return int(same.cumprod(0).sum())


def run_flow(
    model, flow, cache, device, ids, tokens, eager_tokens, guards: str = "all"
) -> tuple[float, float, float | None, int]:
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    compiled = prepare(model, flow, cache, device, guards)
    with torch.no_grad():
        first = seconds(
            lambda: greedy(compiled, ids, tokens), device
        )  # compiles: prefill, decode, recompiles
        got = greedy(compiled, ids, tokens)
        greedy(compiled, ids, 1)  # warm: generate(1) may take paths generate(N) did not
        one = full = float("inf")
        for _ in range(ROUNDS):  # interleaved, so a slow spell of the machine hits both
            one = min(one, seconds(lambda: greedy(compiled, ids, 1), device))
            full = min(full, seconds(lambda: greedy(compiled, ids, tokens), device))
    decode_ms = (full - one) / (tokens - 1) * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return decode_ms, first, peak, leading_equal(got, eager_tokens)


def measure(args: argparse.Namespace) -> list[Row]:
    dims = model_dims(args)
    rows: list[Row] = []
    for arch in args.archs:
        torch.manual_seed(0)
        base = build(arch, dims, args.device)
        ids = torch.randint(1, dims["vocab_size"], (args.batch, args.prompt), device=args.device)
        with torch.no_grad():
            bf16_tokens = greedy(base, ids, args.new_tokens)
        for family in args.families:
            quantized = quantize(copy.deepcopy(base), family)
            with torch.no_grad():
                eager_tokens = greedy(quantized, ids, args.new_tokens)
            for cache in args.caches:
                for flow in args.flows:
                    model, want = (base, bf16_tokens) if flow == "bf16" else (quantized, eager_tokens)
                    qlower.clear_reports()
                    ms, first, peak, equal = run_flow(
                        model, flow, cache, args.device, ids, args.new_tokens, want, args.guards
                    )
                    entries = [d for r in qlower.all_reports() for d in r]
                    lowered = (
                        f"{sum(d.lowered for d in entries)}/{len(entries)}"
                        if flow.startswith("qlower")
                        else ""
                    )
                    rows.append(Row(arch, family, cache, flow, ms, first, peak, equal, lowered))
                    print(f"{arch} {family} {cache} {flow}: {ms:.3f} ms/token, first {first:.1f} s, "
                          f"peak {peak} MiB, tokens equal {equal} {lowered}", flush=True)  # fmt: skip
    return rows


def table(rows: list[Row]) -> str:
    """One line per (arch, family, cache, flow): decode ms/token and its ratio to the same key's bf16 flow."""
    lines = [
        "| model | family | cache | flow | ms/tok (×bf16) | first call s | peak MiB | leading tokens = eager's "
        "| qlower lowered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    bf16 = {(r.arch, r.family, r.cache): r.decode_ms for r in rows if r.flow == "bf16"}
    for r in rows:
        base = bf16.get((r.arch, r.family, r.cache))
        ratio = f" ({base / r.decode_ms:.2f}×)" if base else ""
        peak = "—" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        lines.append(f"| {r.arch} | {r.family} | {r.cache} | {r.flow} | {r.decode_ms:.3f}{ratio} | "
                     f"{r.first_call_s:.1f} | {peak} | {r.tokens_equal} | {r.lowered} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def model_dims(args: argparse.Namespace) -> dict[str, int]:
    """The config's dimensions, with `--layers` decoder layers where given (a 32-layer model: Llama-3-8B's)."""
    dims = TINY if args.tiny else SMALL if args.small else FULL
    return dims if args.layers is None else {**dims, "num_hidden_layers": args.layers}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--small", action="store_true", help="the small config (CPU's default)")
    p.add_argument("--tiny", action="store_true", help="a one-layer toy config (the script's own test)")
    p.add_argument("--archs", default="llama", type=lambda s: s.split(","))
    p.add_argument("--families", default="woq_int8", type=lambda s: s.split(","))
    p.add_argument("--caches", default="dynamic", type=lambda s: s.split(","))
    p.add_argument(
        "--flows", default=",".join(FLOWS), type=lambda s: s.split(","), help=f"of {FLOWS + EXTRA_FLOWS}"
    )
    p.add_argument(
        "--guards", default="all", choices=sorted(GUARD_FILTERS), help="Dynamo's guard filter, every flow"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the config's)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    args.small = args.small or args.device == "cpu"
    if args.new_tokens < 2:
        p.error("--new-tokens must be at least 2 (decode time is generate(N) minus generate(1))")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Every flow compiles afresh, as on a user's first run: a cache hit would shorten the first call and
    # leave qlower's pass (and its report) out of the compile.
    torch.compiler.config.force_disable_caches = True
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(args)
    meta = {
        "device": torch.cuda.get_device_name()
        if args.device == "cuda"
        else torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "batch": args.batch,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "dims": model_dims(args),
        "guards": args.guards,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    (args.out / f"hf_{args.device}.md").write_text(f"{json.dumps(meta)}\n\n{text}")
    (args.out / f"hf_{args.device}.json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]})
    )
    print(text)


if __name__ == "__main__":
    main()
