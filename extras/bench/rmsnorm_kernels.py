"""RMSNorm's arithmetic three ways, each with the output of the model's formula (RMSNorm, model/norms.py) bit
for bit (extras/tests/test_bench_norms.py checks every dtype); they differ only in their backward:
  rms_norm      the model's formula left to autograd: nine elementwise passes backward
  F.rms_norm    torch.nn.functional.rms_norm: one fused kernel each way on CUDA, the formula's ops on CPU
  hand-written  HandWrittenBackward: four passes backward, and only x and the per-row rstd saved
bench_norms.py times them; the model keeps the plain formula (docs/performance.md, "Norm speed", says why).
"""

import torch
import torch.nn.functional as F

from model.norms import rms_normalized


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The model's RMSNorm.forward with a plain gain, as a function of its weight."""
    normalized = rms_normalized(x, eps)
    return normalized if weight is None else normalized * weight


def functional(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """F.rms_norm with the formula's roundings: it multiplies by the weight before rounding to x's dtype,
    which is the same only in float32, so otherwise the weight is applied after it. Autocast is off so that
    its policy for rms_norm cannot upcast x (the formula keeps x's dtype; autocast never touches it)."""
    fused = weight is not None and x.dtype == weight.dtype == torch.float32
    with torch.autocast(x.device.type, enabled=False):
        y = F.rms_norm(x, x.shape[-1:], weight if fused else None, eps)
    return y if weight is None or fused else y * weight


class HandWrittenBackward(torch.autograd.Function):
    """The formula's forward with a backward of four passes over the activation instead of autograd's nine
    (a norm is memory-bound at the model's shapes), saving only x and the per-row rstd. On CPU autograd's
    backward is slower still than its pass count: mean's backward hands on a stride-0 expanded gradient, and
    the scalar ops on it run about 10x slower than on a contiguous tensor (docs/performance.md)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = (xf * rstd).to(x.dtype)
        if weight is not None:
            # In place unless the product changes dtype (bf16 x times a float32 weight under autocast).
            y = y.mul_(weight) if weight.dtype == y.dtype else y * weight
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        dim = x.shape[-1]
        # backward() may be called inside an autocast region, which would run the mat-vecs in bf16/fp16.
        with torch.autocast(x.device.type, enabled=False):
            xf, g = x.float(), grad_out.float()
            # Per row, with gy = g * weight the gradient reaching y = x * rstd:
            #   dx = rstd * (gy - x * rstd^2 * c / dim),   c = sum_j gy_j x_j = (g * x) @ weight
            #   dweight = sum over rows of g * y             = (g * x)^T @ rstd   when y was not rounded
            buf = g * xf
            rows = buf.reshape(-1, dim)
            if weight is None:
                c, dweight = rows.sum(-1), None
                dx = buf.copy_(g)
            else:
                wf = weight.float()
                c = torch.mv(rows, wf)
                if x.dtype == torch.float32:
                    dweight = torch.mv(rows.T, rstd.reshape(-1))
                else:  # the forward multiplied the weight by y rounded to x.dtype: use that exact y
                    dweight = (g * (xf * rstd).to(x.dtype)).reshape(-1, dim).sum(0)
                dweight = dweight.to(weight.dtype)
                dx = torch.mul(g, wf, out=buf)  # both reductions are done, so buf is free
            dx.addcmul_(xf, rstd.square().mul_(c.view_as(rstd)).div_(-dim)).mul_(rstd)
        return dx.to(x.dtype), dweight, None


IMPLEMENTATIONS = {"rms_norm": rms_norm, "F.rms_norm": functional, "hand-written": HandWrittenBackward.apply}
