"""Why is the compiled woq-int8 linear slower than its kernel alone? One GPU run, a few seconds.

    python -P scripts/gpu_exp_woq_code.py   # writes $OUT/woq_code_<M>x<K>x<N>.py (Inductor's output)

Per point: GPU time (scripts/cuda_timing.py, 8 rotating weight sets) of bf16 F.linear, of the
`qlower::woq_int8_linear` op called eagerly (its kernel alone), and of gpt-fast's form compiled with qlower.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import gpu_time_us  # noqa: E402

import qlower  # noqa: E402
from qlower.quantize import quantize_per_row_int8  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
POINTS = ((1, 4096, 4096), (16, 4096, 14336), (1, 4096, 14336))


def model(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return F.linear(x, q.to(x.dtype)) * s


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for m, k, n in POINTS:
        sets = []
        for _ in range(8):
            w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
            q, s = quantize_per_row_int8(w)
            sets.append((w, q, s.to(torch.bfloat16)))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fn = torch.compile(model, dynamic=False, options=qlower.inductor_options(families=("woq_int8",)))
        _, code = run_and_get_code(fn, x, sets[0][1], sets[0][2])
        (OUT / f"woq_code_{m}x{k}x{n}.py").write_text("\n\n# ----\n\n".join(code))
        t_bf16 = gpu_time_us([lambda w=w, x=x: F.linear(x, w) for w, _, _ in sets])
        t_op = gpu_time_us(
            [lambda q=q, s=s, x=x: torch.ops.qlower.woq_int8_linear(x, q, s, None) for _, q, s in sets]
        )
        t_cmp = gpu_time_us([lambda q=q, s=s, x=x, fn=fn: fn(x, q, s) for _, q, s in sets])
        print(f"M={m} {k}->{n}: bf16 {t_bf16:.2f} us, op alone {t_op:.2f} us ({t_bf16 / t_op:.2f}x), "
              f"compiled {t_cmp:.2f} us ({t_bf16 / t_cmp:.2f}x)", flush=True)  # fmt: skip


if __name__ == "__main__":
    with torch.no_grad():
        main()
