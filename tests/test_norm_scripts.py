"""The model's RMSNorm (hand-written backward) against the eager formula, and the two norm scripts end to end."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.model_minimind import RMSNorm

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

EPS = 1e-5


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """MiniMind's original formula, left to autograd: the reference the optimized class must reproduce."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    return y * weight if weight is not None else y


def norm_and_weight(
    dim: int, dtype=torch.float32, affine: bool = True
) -> tuple[RMSNorm, torch.Tensor | None]:
    """An RMSNorm with a non-trivial weight, and a detached copy of that weight for the reference."""
    norm = RMSNorm(dim, EPS, elementwise_affine=affine).to(dtype)
    if not affine:
        return norm, None
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm, norm.weight.detach().clone().requires_grad_()


def grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return list(torch.autograd.grad(out, inputs, dy))


@pytest.mark.parametrize("affine", [True, False])
def test_fp32_forward_and_grads_match_eager(affine):
    torch.manual_seed(0)
    x = (torch.randn(4, 9, 64) * 3).requires_grad_()
    norm, w_ref = norm_and_weight(64, affine=affine)
    out = norm(x)
    weight = norm.weight if affine else None
    torch.testing.assert_close(out, F.rms_norm(x, (64,), weight, EPS), rtol=0, atol=1e-6)
    x_ref = x.detach().clone().requires_grad_()
    ref = eager_rmsnorm(x_ref, w_ref)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    ours = grads(out, [x, *norm.parameters()])
    theirs = grads(ref, [x_ref] + ([w_ref] if affine else []))
    assert len(ours) == len(theirs) == (2 if affine else 1)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_noncontiguous_input_and_expanded_grad():
    """x a transposed view and dy = ones expanded (what .sum() sends back): the backward's reshapes must cope."""
    torch.manual_seed(0)
    x = torch.randn(32, 10).t().requires_grad_()
    norm, w_ref = norm_and_weight(32)
    norm(x).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    eager_rmsnorm(x_ref, w_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.weight.grad, w_ref.grad, rtol=1e-5, atol=1e-5)


def test_bf16_input_and_weight():
    torch.manual_seed(0)
    x = torch.randn(4, 9, 64, dtype=torch.bfloat16, requires_grad=True)
    norm, w_ref = norm_and_weight(64, torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    x_ref = x.detach().clone().requires_grad_()
    ref = eager_rmsnorm(x_ref, w_ref)
    # Same float32 statistics, same two roundings to bf16 (after normalizing, after the weight): identical output.
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    ours = grads(out, [x, norm.weight])
    assert [g.dtype for g in ours] == [torch.bfloat16, torch.bfloat16]
    # The reference's backward rounds every intermediate to bf16; ours only rounds the results.
    for a, b in zip(ours, grads(ref, [x_ref, w_ref]), strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_bf16_input_float32_weight_gives_float32_like_eager():
    """What autocast feeds a norm: bf16 activations, the float32 parameter. Eager promotes the product to fp32."""
    torch.manual_seed(0)
    x = torch.randn(4, 9, 64, dtype=torch.bfloat16, requires_grad=True)
    norm, w_ref = norm_and_weight(64)
    out, ref = norm(x), eager_rmsnorm(x, w_ref)
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    gx, gw = grads(out, [x, norm.weight])
    gx_ref, gw_ref = grads(ref, [x, w_ref])
    assert (gx.dtype, gw.dtype) == (torch.bfloat16, torch.float32)
    torch.testing.assert_close(gx.float(), gx_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-5)


def tiny_net(norm: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), norm, nn.GELU(), nn.Linear(32, 8))


def test_autocast_bf16_forward_backward_matches_eager_reference():
    class EagerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(32))

        def forward(self, x):
            return eager_rmsnorm(x, self.weight)

    x = torch.randn(4, 8, 32)
    nets = [tiny_net(RMSNorm(32, EPS)), tiny_net(EagerNorm())]
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


@pytest.mark.parametrize("affine", [True, False])
def test_torch_compile_matches_eager(affine):
    net = tiny_net(RMSNorm(32, EPS, elementwise_affine=affine))
    compiled = torch.compile(net, fullgraph=True)  # fullgraph: the autograd.Function must not break the graph
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


# ----------------------------------------------------------------------------------------------------------
# The scripts, at tiny sizes


def run_script(*args: str) -> str:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_bench_norms_script(tmp_path):
    ops = ["rmsnorm_eager", "F.rms_norm", "layernorm", "rmsnorm_compiled", "model.RMSNorm", "copy"]
    out = run_script(
        str(SCRIPTS / "bench_norms.py"),
        "--tokens",
        "64",
        "--hidden",
        "32",
        "--iters",
        "5",
        "--device",
        "cpu",
        "--json",
        str(tmp_path / "bench.json"),
    )
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("op "))
    for col in ["dtype", "fwd ms", "fwd+bwd ms", "fwd GB/s", "f+b GB/s", "fwd/LN", "f+b/LN", "fwd/eager"]:
        assert col in header
    for op in ops:
        for dtype in ["fp32", "bf16"]:
            assert any(line.split()[:2] == [op, dtype] for line in lines), (op, dtype)

    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["tokens"] == 64 and data["config"]["hidden"] == 32
    rows = data["results"]
    assert sorted((r["op"], r["dtype"]) for r in rows) == sorted(
        (o, d) for o in ops for d in ["fp32", "bf16"]
    )
    for r in rows:
        for key in [
            "fwd_ms",
            "fwd_bwd_ms",
            "fwd_gbps",
            "fwd_bwd_gbps",
            "first_call_s",
            "fwd_vs_layernorm",
            "fwd_bwd_vs_layernorm",
            "fwd_vs_eager",
            "fwd_bwd_vs_eager",
        ]:
            assert math.isfinite(r[key]) and r[key] > 0, (r["op"], key, r[key])


def test_bench_norms_rejects_unknown_op():
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_norms.py"), "--ops", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and "nope" in lines[0]


def test_why_normalization_script(tmp_path):
    out = run_script(
        str(SCRIPTS / "why_normalization.py"),
        "--layers",
        "3",
        "--width",
        "64",
        "--batch",
        "8",
        "--json",
        str(tmp_path / "why.json"),
    )
    lines = out.splitlines()
    assert any("std no-norm" in line and "|dW| RMSNorm" in line for line in lines)
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(len(r) == 5 for r in rows)

    data = json.loads((tmp_path / "why.json").read_text())
    assert data["config"] == {"seed": 0, "layers": 3, "width": 64, "batch": 8}
    for net in ["no_norm", "rmsnorm"]:
        for key in ["std", "grad_norm"]:
            values = data[net][key]
            assert len(values) == 3 and all(math.isfinite(v) and v > 0 for v in values), (net, key)
    # The point of the experiment: without a norm the signal decays layer after layer; with RMSNorm every
    # ReLU sees unit-RMS input, so its output std stays near sqrt(1/2 - 1/(2 pi)) = 0.58.
    assert data["no_norm"]["std"][-1] < 0.5 * data["no_norm"]["std"][0]
    assert all(0.4 < s < 0.8 for s in data["rmsnorm"]["std"])
