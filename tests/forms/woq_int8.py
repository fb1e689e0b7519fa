"""Weight-only int8 linears in the graph forms users write, plus a float64 reference (shared by tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FORMS = ("gpt_fast", "scale_first", "scale_n1", "kn_weight", "unscaled", "einsum")


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class WoqLinear(nn.Module):
    """y = x @ (w_int8 * s).T + b, written in one of FORMS."""

    def __init__(
        self,
        k: int,
        n: int,
        dtype: torch.dtype,
        form: str = "gpt_fast",
        bias: bool = False,
        scale_dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.form = form
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        s = torch.rand(n, generator=g) * 0.02 + 0.005
        if form == "unscaled":
            s = torch.ones(n)
        self.w = _frozen(w.t().contiguous() if form == "kn_weight" else w)
        self.s = _frozen((s.view(n, 1) if form == "scale_n1" else s).to(scale_dtype or dtype))
        self.b = _frozen(torch.randn(n, generator=g).to(dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, s, f = self.w, self.s, self.form
        if f == "gpt_fast":
            y = F.linear(x, w.to(x.dtype)) * s
        elif f == "scale_first":
            return F.linear(x, w.to(x.dtype) * s[:, None].to(x.dtype), self.b)
        elif f == "scale_n1":
            return F.linear(x, (w.to(x.dtype) * s.to(x.dtype)), self.b)
        elif f == "kn_weight":
            y = torch.matmul(x, w.to(x.dtype)) * s
        elif f == "unscaled":
            y = F.linear(x, w.to(x.dtype))
        elif f == "einsum":
            y = torch.einsum("...k,nk->...n", x, w.to(x.dtype)) * s
        else:
            raise ValueError(f)
        return y if self.b is None else y + self.b

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 result of the exact math the module approximates."""
        w = self.w.double() if self.form != "kn_weight" else self.w.double().t()
        s = self.s.double().reshape(-1)
        y = x.double() @ (w * s[:, None]).t()
        return y if self.b is None else y + self.b.double()


def assert_close_to_reference(
    out: torch.Tensor, eager: torch.Tensor, ref: torch.Tensor, slack: float = 2.0
) -> None:
    """The compiled error vs float64 stays within `slack` x the eager path's own error, or within two ulps of
    the output's magnitude (both round to the output dtype, in different places)."""
    assert out.shape == eager.shape and out.dtype == eager.dtype, (
        out.shape,
        out.dtype,
        eager.shape,
        eager.dtype,
    )
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    eager_err = (eager.double() - ref).abs().max().item()
    ulp = torch.finfo(out.dtype).eps * ref.abs().max().item()
    assert err <= max(slack * eager_err, 2 * ulp), f"error {err:.3g} vs eager {eager_err:.3g} (ulp {ulp:.3g})"


# ------------------------------------------------------------------------------------------ fuzz variants
# Forms scripts/fuzz_compile.py's variants draw (view_epilogue, expanded_scale, fp16_extreme); each keeps
# `reference` the float64 math of the user's formula.

HEAD_SPELLINGS = ("view", "unflatten", "reshape", "view_neg")


def split_heads(y: torch.Tensor, lead: tuple, h: int, d: int, spelling: str) -> torch.Tensor:
    """y [*lead, H * D] -> [*lead, H, D], spelled the ways attention code writes it."""
    if spelling == "view":
        return y.view(*lead, h, d)
    if spelling == "unflatten":
        return y.unflatten(-1, (h, d))
    if spelling == "reshape":
        return y.reshape(*lead, h, d)
    if spelling == "view_neg":
        return y.view(*lead, -1, d)
    raise ValueError(spelling)


class WoqHeads(WoqLinear):
    """gpt-fast's woq linear with its per-channel scale (and bias) applied after the heads view:
    `F.linear(x, w.to(dt)).view(..., H, D) * s.view(H, D)` — the same linear, its epilogue in [H, D] form."""

    def __init__(
        self,
        k: int,
        n_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        spelling: str = "view",
        bias: bool = False,
        scale_dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(k, n_heads * head_dim, dtype, "gpt_fast", bias, scale_dtype, seed)
        self.h, self.d, self.spelling = n_heads, head_dim, spelling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = split_heads(F.linear(x, self.w.to(x.dtype)), x.shape[:-1], self.h, self.d, self.spelling)
        y = y * self.s.view(self.h, self.d)
        return y if self.b is None else y + self.b.view(self.h, self.d)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return super().reference(x).reshape(*x.shape[:-1], self.h, self.d)


EXPAND_SPELLINGS = ("out_n", "out_1n", "out_n1", "out_0d", "weight_n1", "weight_0d")


class WoqExpandScale(WoqLinear):
    """The woq scale reaching its multiply through `.expand`: `mm(x, w.t()) * s.expand(M, N)` with s [N],
    [1, N], [N, 1] (transposed first) or 0-d, or on the weight, `w * s.expand(N, K)` with s [N, 1] or 0-d."""

    def __init__(
        self,
        k: int,
        n: int,
        dtype: torch.dtype,
        spelling: str,
        bias: bool = False,
        scale_dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(k, n, dtype, "gpt_fast", bias, scale_dtype, seed)
        shape = {"out_n": (n,), "out_1n": (1, n), "out_n1": (n, 1), "weight_n1": (n, 1)}.get(spelling, ())
        s = self.s.detach()
        self.s = _frozen((s.mean() if shape == () else s).reshape(shape).contiguous())
        self.spelling = spelling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        (n, k), m, s = self.w.shape, x2.shape[0], self.s
        if self.spelling.startswith("weight"):
            y = F.linear(x2, self.w.to(x.dtype) * s.expand(n, k).to(x.dtype))
        else:
            y = F.linear(x2, self.w.to(x.dtype)) * (s.t() if self.spelling == "out_n1" else s).expand(m, n)
        if self.b is not None:
            y = y + self.b
        return y.reshape(*x.shape[:-1], n)


SCALE_RANGES = ("large", "tiny", "mixed")


class WoqExtremeScale(WoqLinear):
    """Per-channel scales at fp16's edges, in one of FORMS: 'large' (up to 4096: w * s overflows fp16 once
    folded into the weight, while the user's `mm(x, w) * s` stays finite for activations of std `x_std`),
    'tiny' (2^-14 .. 2^-24: fp16 subnormals), 'mixed' (channels of both). Weight-scale forms overflow in the
    user's own formula with large scales, so only 'tiny' takes them."""

    def __init__(
        self,
        k: int,
        n: int,
        dtype: torch.dtype,
        form: str,
        scale_range: str,
        bias: bool = False,
        scale_dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        if scale_range != "tiny" and form in ("scale_first", "scale_n1", "unscaled"):
            raise ValueError(
                f"form {form} with {scale_range} scales: the user's formula overflows or has none"
            )
        super().__init__(k, n, dtype, form, bias, scale_dtype, seed)
        g = torch.Generator().manual_seed(seed + 1)
        u = torch.rand(n, generator=g)
        large, tiny = 2.0 ** (u * 12), 2.0 ** (-14 - u * 10)
        large[0], tiny[0] = 4096.0, 2.0**-24
        s = {
            "large": large,
            "tiny": tiny,
            "mixed": torch.where(torch.rand(n, generator=g) < 0.5, large, tiny),
        }[scale_range]
        self.s = _frozen((s.view(n, 1) if form == "scale_n1" else s).to(scale_dtype or dtype))
        # |x @ w.T| ~ 0.5 * 73 * sqrt(K) * x_std: about 0.5 for 'large', so 4096 * that stays < 65504
        self.x_std = 1.0 if scale_range == "tiny" else 0.5 / (73.0 * k**0.5)
        if self.b is not None and scale_range == "tiny":
            self.b = _frozen(self.b * 2.0**-10)  # a bias of the outputs' size, not one that hides them
