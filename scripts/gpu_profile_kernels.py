"""Launch qlower's decode-size kernels a few times each, for Nsight Compute (ncu) to profile one launch of each.

    ncu --launch-skip 3 --launch-count 1 -k regex:mx_hfma --section SpeedOfLight ... python -P scripts/gpu_profile_kernels.py

Why: the sweeps say which config is fastest, not why a kernel sits at 45-55% of the HBM floor (MXFP4 M=1
4096->14336: 14.6 us against 6.5; woq-int8 M=1 4096->4096: 7.0 us against 3.5). ncu's throughput, stall and
occupancy sections answer whether it is bound by memory parallelism, instruction issue or latency.
Cases (all bf16 activations, one weight set, 6 launches each): MXFP4 weight-only M=1 4096->14336; woq-int8
M=1 4096->4096, M=16 4096->14336, M=128 4096->4096.
"""

from __future__ import annotations

import torch

from qlower.lowerings.triton_kernels import mx_ops, ops  # noqa: F401  (registers the ops; run with -P)

LAUNCHES = 6


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"
    k, n = 4096, 14336
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8, generator=g)
    codes = torch.randint(120, 130, (n, k // 32), device=dev, dtype=torch.uint8, generator=g)
    for _ in range(LAUNCHES):
        torch.ops.qlower.mx_linear(
            x, None, w, codes, None, mx_ops.FLOAT, mx_ops.E2M1, False, False, torch.bfloat16
        )
    for m, k, n in ((1, 4096, 4096), (16, 4096, 14336), (128, 4096, 4096)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
        q = torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8, generator=g)
        s = torch.rand(n, device=dev, generator=g).to(torch.bfloat16)
        for _ in range(LAUNCHES):
            torch.ops.qlower.woq_int8_linear(x, q, s, None)
    torch.cuda.synchronize()
    print("launched", flush=True)


if __name__ == "__main__":
    main()
