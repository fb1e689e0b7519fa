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
