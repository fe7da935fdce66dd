"""The model's RMSNorm under bf16 autocast and torch.compile against the formula. (The RMSNorm kernels and
their benchmark are extras/bench's: extras/tests/test_bench_norms.py.)"""

import pytest
import torch
from torch import nn

from model.model_minimind import RMSNorm

EPS = 1e-5


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """MiniMind's original formula, written out here: the reference the model's RMSNorm must reproduce."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    return y * weight if weight is not None else y


def tiny_net(norm: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), norm, nn.GELU(), nn.Linear(32, 8))


def test_autocast_bf16_forward_backward_matches_eager_reference():
    reference = RMSNorm(32, EPS)
    reference.forward = lambda x: eager_rmsnorm(x, reference.weight)
    x = torch.randn(4, 8, 32)
    nets = [tiny_net(RMSNorm(32, EPS)), tiny_net(reference)]
    for net in nets:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(x)
            assert out.dtype == torch.bfloat16
            assert net[1](net[0](x)).dtype == torch.float32  # bf16 Linear output times the fp32 weight
        out.float().square().mean().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    for ours, ref in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert ours.grad.dtype == torch.float32
        torch.testing.assert_close(ours.grad, ref.grad, rtol=2e-2, atol=2e-3)


@pytest.mark.slow  # an inductor compile per case
@pytest.mark.parametrize("affine", [True, False])
def test_torch_compile_matches_eager(affine):
    net = tiny_net(RMSNorm(32, EPS, elementwise_affine=affine))
    compiled = torch.compile(net, fullgraph=True)  # fullgraph: the norm must not break the graph
    x = torch.randn(4, 8, 32)
    out = compiled(x)
    out.square().mean().backward()
    compiled_grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    ref = net(x)
    ref.square().mean().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, p in zip(compiled_grads, net.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-5)
