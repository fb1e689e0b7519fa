"""bench_model.py's variants: `<quantization>:<compiler>`, the quantizations applied to the bf16 decoder, the
tensor-parallel shards of gpt-fast's layout, and the weight bytes one rank reads per step."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from qlower.quantize import DynamicInt8Linear, WeightOnlyInt8Linear, mx_format
from scripts.decoder.model import TP, Config, Decoder


class MXWeightOnlyLinear(nn.Module):
    """MX weight-only, hand-written: elements (packed e2m1 bytes or e4m3) and e8m0 codes per 32 along K."""

    def __init__(self, linear: nn.Linear, elem: str) -> None:
        super().__init__()
        self.elem = elem
        q, e = mx_format.quantize(linear.weight.detach().float(), elem)
        self.register_buffer("q", q)
        self.register_buffer("e", e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, mx_format.dequantize(self.q, self.e, self.elem, x.dtype))


def _swap_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> None:
    for blk in model.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(blk, name, make(getattr(blk, name)))


def _torchao(config_name: str) -> Callable[[nn.Module], None]:
    def apply(model: nn.Module) -> None:
        from torchao import quantization as ao

        ao.quantize_(model, getattr(ao, config_name)())

    return apply


# quantization key -> (in-place quantizer, weight bytes per element of N*K, extra bytes per output row, whether
# it is sharded before quantizing)
QUANTS: dict[str, tuple[Callable[[nn.Module], None] | None, float, float, bool]] = {
    "bf16": (None, 2.0, 0.0, False),
    "woq": (lambda m: _swap_linears(m, WeightOnlyInt8Linear.from_linear), 1.0, 2.0, False),
    "dyn": (lambda m: _swap_linears(m, DynamicInt8Linear.from_linear), 1.0, 4.0, False),
    "ao-woq": (_torchao("Int8WeightOnlyConfig"), 1.0, 2.0, True),
    "ao-dyn": (_torchao("Int8DynamicActivationInt8WeightConfig"), 1.0, 2.0, True),
    "mxfp4": (
        lambda m: _swap_linears(m, lambda lin: MXWeightOnlyLinear(lin, "e2m1")),
        0.5 + 1 / 32,
        0.0,
        False,
    ),
    "mxfp8": (
        lambda m: _swap_linears(m, lambda lin: MXWeightOnlyLinear(lin, "e4m3")),
        1.0 + 1 / 32,
        0.0,
        False,
    ),
}
DEFAULT_VARIANTS = (
    "bf16",
    "woq:stock",
    "woq:qlower",
    "ao-woq:stock",
    "ao-woq:qlower",
    "ao-dyn:stock",
    "ao-dyn:qlower",
    "mxfp4:qlower",
    "mxfp8:qlower",
)
ALL_VARIANTS = ("bf16", *(f"{q}:{c}" for q in QUANTS if q != "bf16" for c in ("stock", "qlower")))


def parse_variants(text: str) -> list[str]:
    names: list[str] = []
    for item in text.split(","):
        item = item.strip()
        names += (
            DEFAULT_VARIANTS
            if item == "default"
            else ALL_VARIANTS
            if item == "all"
            else [item]
            if item
            else []
        )
    bad = [v for v in names if v not in ALL_VARIANTS]
    if bad:
        raise SystemExit(f"bench_model: unknown variants {bad}; choose from {', '.join(ALL_VARIANTS)}")
    names = list(dict.fromkeys(names))
    return names if "bf16" in names else ["bf16", *names]  # the baseline of every ratio


def split_variant(variant: str) -> tuple[str, str]:
    quant, _, compiler = variant.partition(":")
    return quant, compiler or "stock"


# ---- tensor parallel ----


def shard_linear(
    lin: nn.Module, k: int, rows: list[tuple[int, int]] | None, cols: tuple[int, int] | None
) -> None:
    """Keep this rank's shard of every weight tensor of `lin` (dim 0 is N for all of qlower's forms and
    nn.Linear). Column-parallel (`rows`: the kept row ranges): 2-D and 1-D tensors (per-channel scales) are
    sliced. Row-parallel (`cols`: the kept K range): 2-D tensors are sliced along dim 1 in proportion to K (int8
    weight K columns, packed e2m1 K / 2, e8m0 codes K / 32); 1-D tensors (the scales) stay whole."""
    for store in (lin._parameters, lin._buffers):
        for name, t in list(store.items()):
            if t is None or t.dim() not in (1, 2):
                continue
            u = t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.int8 else t
            if rows is not None:
                u = torch.cat([u[a:b] for a, b in rows])
            elif t.dim() == 2:
                width = t.shape[1]
                if cols[0] * width % k or cols[1] * width % k:
                    raise SystemExit(f"bench_model: a K shard {cols} of {k} splits a block of {name}")
                u = u[:, cols[0] * width // k : cols[1] * width // k]
            else:
                continue
            u = u.contiguous().view(t.dtype) if u.dtype != t.dtype else u.contiguous()
            store[name] = nn.Parameter(u, requires_grad=False) if isinstance(t, nn.Parameter) else u


def shard(model: Decoder, tp: TP) -> None:
    """gpt-fast's tp.py layout: qkv and gate/up column-parallel (each of q, k, v, gate, up split by rank),
    o and down row-parallel (their outputs summed by `TP.all_reduce` in the forward)."""
    cfg, r, w = model.cfg, tp.rank, tp.world
    hd = cfg.head_dim
    for name, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("hidden", cfg.hidden)):
        if n % w:
            raise SystemExit(f"bench_model: --tp {w} does not divide {name} = {n}")

    def rows(sizes: list[int]) -> list[tuple[int, int]]:
        out, off = [], 0
        for s in sizes:
            out.append((off + r * s // w, off + (r + 1) * s // w))
            off += s
        return out

    q, kv, hid = cfg.heads * hd, cfg.kv_heads * hd, cfg.hidden
    for blk in model.layers:
        shard_linear(blk.qkv, cfg.dim, rows([q, kv, kv]), None)
        shard_linear(blk.gate_up, cfg.dim, rows([hid, hid]), None)
        shard_linear(blk.o, q, None, (r * q // w, (r + 1) * q // w))
        shard_linear(blk.down, hid, None, (r * hid // w, (r + 1) * hid // w))
        blk.heads, blk.kv_heads = cfg.heads // w, cfg.kv_heads // w


@contextlib.contextmanager
def tp_world(tp: int | None, device: str) -> Iterator[tuple[TP, str]]:
    """The TP world and this rank's device. `--tp N` under torchrun joins its world; without torchrun, a world
    of 1 in this process (the dry run of the same code), taken down again at the end."""
    if tp is None:
        yield TP(), device
        return
    import torch.distributed as dist

    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    backend = "nccl" if device.startswith("cuda") else "gloo"
    own = not dist.is_initialized()
    if own and "RANK" in os.environ:  # torchrun
        dist.init_process_group(backend)
    elif own:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        world = dist.get_world_size()
        if world != tp:
            raise SystemExit(
                f"bench_model: --tp {tp} but the world has {world} processes (torchrun --nproc-per-node)"
            )
        yield TP(dist.get_rank(), world, dist.group.WORLD), device
    finally:
        if own:
            dist.destroy_process_group()


def weight_bytes(cfg: Config, quant: str, world: int) -> int:
    """Bytes of quantized weights one rank reads per step (the HBM bound's numerator)."""
    _, per_elem, per_row, _ = QUANTS[quant]
    hd = cfg.head_dim
    total = 0.0
    for n, k, column in (
        ((cfg.heads + 2 * cfg.kv_heads) * hd, cfg.dim, True),
        (cfg.dim, cfg.heads * hd, False),
        (2 * cfg.hidden, cfg.dim, True),
        (cfg.dim, cfg.hidden, False),
    ):  # per-row scales: sliced on column-parallel shards, whole on row-parallel ones
        total += n * k * per_elem / world + n * per_row / (world if column else 1)
    return int(total * cfg.layers)


def build_variant(base: Decoder, quant: str, tp: TP, batch: int, seq: int) -> Decoder:
    quantize, _, _, shard_first = QUANTS[quant]
    model = copy.deepcopy(base)
    if tp.group is not None and shard_first:
        shard(model, tp)
    if quantize is not None:
        quantize(model)
    if tp.group is not None and not shard_first:
        shard(model, tp)
    model.setup_cache(batch, seq)
    return model
