"""RMSNorm's arithmetic three ways, and which way the model takes on each device and dtype. Each computes the eager
formula's output bit for bit (tests/test_norm_scripts.py checks every dtype) and differs only in its backward:
  eager         the formula left to autograd: nine elementwise passes backward
  F.rms_norm    torch.nn.functional.rms_norm: one fused kernel each way on CUDA; on CPU the formula's ops again
  hand-written  HandWrittenBackward: four passes backward, and only x and the per-row rstd saved
scripts/bench_norms.py measures them; the numbers behind CHOICE are in docs/performance.md ("Norm speed").
"""

import torch
import torch.nn.functional as F


def eager(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else y * weight


def functional(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """F.rms_norm with the formula's roundings: it multiplies by the weight before rounding to x's dtype, which
    is the same only in float32, so otherwise the weight is applied after it. Autocast is off so that its
    policy for rms_norm cannot upcast x (the formula keeps x's dtype; autocast never touches it)."""
    fused = weight is not None and x.dtype == weight.dtype == torch.float32
    with torch.autocast(x.device.type, enabled=False):
        y = F.rms_norm(x, x.shape[-1:], weight if fused else None, eps)
    return y if weight is None or fused else y * weight


class HandWrittenBackward(torch.autograd.Function):
    """The eager formula's forward with a backward of four passes over the activation instead of autograd's nine
    (a norm is memory-bound at the model's shapes), saving only x and the per-row rstd. On CPU autograd's
    backward is slower still than its pass count: mean's backward hands on a stride-0 expanded gradient, and
    the scalar ops on it run about 10x slower than on a contiguous tensor (docs/performance.md)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = (xf * rstd).to(x.dtype)
        if weight is not None:
            # In place unless the product changes dtype (bf16 x times a float32 weight under autocast -> float32).
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


IMPLEMENTATIONS = {"eager": eager, "F.rms_norm": functional, "hand-written": HandWrittenBackward.apply}

# device type -> the implementation with the fastest forward+backward in scripts/bench_norms.py for float32,
# bfloat16 and float16 input (docs/performance.md, "Norm speed"; CUDA's not yet measured on a GPU). On CPU it won
# on AVX-512 and AMX machines in every dtype; one 2-core AVX2 machine measured it 1.2x slower than eager in bf16.
# Any other device or dtype runs the eager formula.
CHOICE = {"cpu": "hand-written", "cuda": "F.rms_norm"}


def implementation_for(device_type: str, dtype: torch.dtype) -> str:
    """The path the model's RMSNorm takes for input of this dtype on this kind of device."""
    measured = dtype in (torch.float32, torch.bfloat16, torch.float16)
    return CHOICE.get(device_type, "eager") if measured else "eager"


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if torch.compiler.is_compiling():
        # Traced by torch.compile: the plain formula, which inductor fuses into one kernel each way (the
        # rmsnorm_compiled row); the hand-written backward's mat-vecs would stay separate library calls.
        return eager(x, weight, eps)
    return IMPLEMENTATIONS[implementation_for(x.device.type, x.dtype)](x, weight, eps)
