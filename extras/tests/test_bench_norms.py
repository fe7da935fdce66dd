"""extras/bench/rmsnorm_kernels.py: every implementation against RMSNorm's formula written out here, in every
dtype; and extras/bench/bench_norms.py end to end at a tiny size."""

import json
import math

import pytest
import torch

from extras.bench import bench_norms
from extras.bench.rmsnorm_kernels import IMPLEMENTATIONS, functional

EPS = 1e-5
# (input dtype, weight dtype): float32 and half-precision models, and autocast's bf16 activations with the
# float32 parameter, where the formula promotes the output to float32.
DTYPE_CASES = [pytest.param(x, w, id=f"{x}-{w}".replace("torch.", "")) for x, w in [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32)]]


def formula(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """RMSNorm as Llama computes it: statistics in float32, rounded back to x's dtype before the weight."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    return y * weight if weight is not None else y


def grads(out: torch.Tensor, inputs: list[torch.Tensor | None], dy: torch.Tensor | None = None) -> list:
    if dy is None:
        dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    return list(torch.autograd.grad(out, [t for t in inputs if t is not None], dy))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPE_CASES)
@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_every_implementation_has_the_formulas_output_and_gradients(name, x_dtype, w_dtype, affine):
    """The output bit for bit; the gradients within the rounding of x's dtype (the formula's autograd backward
    rounds every intermediate to that dtype, the implementations only the results)."""
    torch.manual_seed(0)
    x = (torch.randn(4, 9, 64) * 3).to(x_dtype).requires_grad_()
    weight = torch.empty(64).uniform_(0.5, 1.5).to(w_dtype).requires_grad_() if affine else None
    x_ref = x.detach().clone().requires_grad_()
    w_ref = None if weight is None else weight.detach().clone().requires_grad_()
    out, ref = IMPLEMENTATIONS[name](x, weight, EPS), formula(x_ref, w_ref)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    ours, theirs = grads(out, [x, weight]), grads(ref, [x_ref, w_ref])
    assert [g.dtype for g in ours] == [g.dtype for g in theirs]
    tol = 1e-5 if x_dtype == torch.float32 else 2e-2
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_noncontiguous_input_and_expanded_grad(name):
    """x a transposed view and dy = ones expanded (what .sum() sends back): the backward's reshapes cope."""
    torch.manual_seed(0)
    x = torch.randn(32, 10).t().requires_grad_()
    weight = torch.empty(32).uniform_(0.5, 1.5).requires_grad_()
    IMPLEMENTATIONS[name](x, weight, EPS).sum().backward()
    x_ref, w_ref = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    formula(x_ref, w_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, w_ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPE_CASES)
def test_f_rms_norm_on_cuda_matches_the_formula(x_dtype, w_dtype):
    """F.rms_norm's fused CUDA kernel sums the squares in another order than the formula's mean, so the output
    may differ in the last bit."""
    torch.manual_seed(0)
    x = (torch.randn(64, 9, 512, device="cuda") * 3).to(x_dtype).requires_grad_()
    weight = torch.empty(512, device="cuda").uniform_(0.5, 1.5).to(w_dtype).requires_grad_()
    out, ref = functional(x, weight, EPS), formula(x, weight)
    assert out.dtype == ref.dtype
    ulp = 1e-6 if x_dtype == torch.float32 else torch.finfo(x_dtype).eps
    torch.testing.assert_close(out.float(), ref.float(), rtol=ulp, atol=ulp)
    dy = torch.randn_like(out)
    for a, b in zip(grads(out, [x, weight], dy), grads(ref, [x, weight], dy), strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.slow  # its compiled rows are inductor compiles
def test_bench_norms_script(tmp_path, capsys, fresh_dynamo):
    bench_norms.main(["--tokens", "64", "--hidden", "32", "--iters", "5", "--device", "cpu",
                      "--json", str(tmp_path / "bench.json")])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("op "))
    assert header.split() == ["op", "dtype", "fwd", "ms", "fwd+bwd", "ms", "fwd", "GB/s", "f+b", "GB/s",
                              "fwd/LN", "f+b/LN", "fwd/rms", "f+b/rms"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["tokens"] == 64 and data["config"]["hidden"] == 32
    assert data["environment"]["torch"] == torch.__version__ and data["environment"]["threads"] >= 1
    cells = [(op, dtype) for dtype in ["fp32", "bf16"] for op in bench_norms.OPS]
    assert [(r["op"], r["dtype"]) for r in data["results"]] == cells
    assert all(any(line.split()[:2] == list(cell) for line in lines) for cell in cells)
    for r in data["results"]:
        for key in ["fwd_ms", "fwd_bwd_ms", "fwd_gbps", "fwd_bwd_gbps", "first_call_s", "fwd_vs_layernorm",
                    "fwd_bwd_vs_layernorm", "fwd_vs_rms_norm", "fwd_bwd_vs_rms_norm"]:
            assert math.isfinite(r[key]) and r[key] > 0, (r["op"], key, r[key])
    assert sum(line.startswith("compiled ") and "(compilation) took" in line for line in lines) == 2
