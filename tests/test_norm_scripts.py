"""RMSNorm's implementations (model/rmsnorm_kernels.py) against the eager formula, the path the model picks, and
the two norm scripts end to end."""

import json
import math

import pytest
import torch
from torch import nn

import model.rmsnorm_kernels as kernels
from common.cli import run_cli
from model.model_minimind import RMSNorm
from scripts import bench_norms, why_normalization

EPS = 1e-5
# (input dtype, weight dtype): float32 and half-precision models, and autocast's bf16 activations with the
# float32 parameter, where the formula promotes the output to float32.
DTYPE_CASES = [pytest.param(x, w, id=f"{x}-{w}".replace("torch.", "")) for x, w in [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32)]]


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """MiniMind's original formula, written out here: the reference every implementation must reproduce."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    return y * weight if weight is not None else y


def grads(out: torch.Tensor, inputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    return list(torch.autograd.grad(out, [t for t in inputs if t is not None], dy))


def check_against_eager(norm, x: torch.Tensor, weight: torch.Tensor | None) -> None:
    """norm(x, weight) has eager's output bit for bit and its gradients within the rounding of x's dtype (the
    reference's autograd backward rounds every intermediate to that dtype; the implementations only the results)."""
    x_ref = x.detach().clone().requires_grad_()
    w_ref = None if weight is None else weight.detach().clone().requires_grad_()
    out, ref = norm(x, weight), eager_rmsnorm(x_ref, w_ref)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    ours, theirs = grads(out, [x, weight]), grads(ref, [x_ref, w_ref])
    assert [g.dtype for g in ours] == [g.dtype for g in theirs]
    tol = 1e-5 if x.dtype == torch.float32 else 2e-2
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPE_CASES)
@pytest.mark.parametrize("name", list(kernels.IMPLEMENTATIONS))
def test_every_implementation_matches_eager(name, x_dtype, w_dtype, affine):
    torch.manual_seed(0)
    x = (torch.randn(4, 9, 64) * 3).to(x_dtype).requires_grad_()
    weight = torch.empty(64).uniform_(0.5, 1.5).to(w_dtype).requires_grad_() if affine else None
    check_against_eager(lambda x, weight: kernels.IMPLEMENTATIONS[name](x, weight, EPS), x, weight)


@pytest.mark.parametrize("name", list(kernels.IMPLEMENTATIONS))
def test_noncontiguous_input_and_expanded_grad(name):
    """x a transposed view and dy = ones expanded (what .sum() sends back): the backward's reshapes must cope."""
    torch.manual_seed(0)
    x = torch.randn(32, 10).t().requires_grad_()
    weight = torch.empty(32).uniform_(0.5, 1.5).requires_grad_()
    kernels.IMPLEMENTATIONS[name](x, weight, EPS).sum().backward()
    x_ref, w_ref = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    eager_rmsnorm(x_ref, w_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, w_ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPE_CASES)
def test_cuda_path_matches_eager_on_cuda(x_dtype, w_dtype):
    """F.rms_norm's fused CUDA kernel sums the squares in another order than eager's mean, so the output may
    differ from the formula's in the last bit (`pytest -k cuda` on a GPU checks it)."""
    torch.manual_seed(0)
    x = (torch.randn(64, 9, 512, device="cuda") * 3).to(x_dtype).requires_grad_()
    weight = torch.empty(512, device="cuda").uniform_(0.5, 1.5).to(w_dtype).requires_grad_()
    out, ref = kernels.functional(x, weight, EPS), eager_rmsnorm(x, weight)
    assert out.dtype == ref.dtype
    ulp = 1e-6 if x_dtype == torch.float32 else torch.finfo(x_dtype).eps
    torch.testing.assert_close(out.float(), ref.float(), rtol=ulp, atol=ulp)
    dy = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, [x, weight], dy), torch.autograd.grad(ref, [x, weight], dy), strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


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


@pytest.mark.slow  # its rmsnorm_compiled rows are inductor compiles
def test_bench_norms_script(tmp_path, capsys, fresh_dynamo):
    bench_norms.main(["--tokens", "64", "--hidden", "32", "--iters", "5", "--device", "cpu",
                      "--json", str(tmp_path / "bench.json")])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("op "))
    for col in ["dtype", "fwd ms", "fwd+bwd ms", "fwd GB/s", "f+b GB/s", "fwd/LN", "f+b/LN", "fwd/eager"]:
        assert col in header
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["tokens"] == 64 and data["config"]["hidden"] == 32
    assert data["environment"]["torch"] == torch.__version__ and data["environment"]["threads"] >= 1
    rows = data["results"]
    cells = [(op, dtype) for dtype in ["fp32", "bf16"] for op in bench_norms.OPS]
    assert [(r["op"], r["dtype"]) for r in rows] == cells
    assert all(any(line.split()[:2] == list(cell) for line in lines) for cell in cells)
    for dtype, torch_dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
        path = kernels.implementation_for("cpu", torch_dtype)
        assert data["config"]["model_paths"][dtype] == path
        model_row = next(r for r in rows if r["op"] == "model.RMSNorm" and r["dtype"] == dtype)
        assert f"model.RMSNorm on cpu {dtype}: {path}, forward+backward " \
               f"{model_row['fwd_bwd_vs_layernorm']:.2f}x LayerNorm's time" in lines
    for r in rows:
        for key in ["fwd_ms", "fwd_bwd_ms", "fwd_gbps", "fwd_bwd_gbps", "first_call_s", "fwd_vs_layernorm",
                    "fwd_bwd_vs_layernorm", "fwd_vs_eager", "fwd_bwd_vs_eager"]:
            assert math.isfinite(r[key]) and r[key] > 0, (r["op"], key, r[key])


@pytest.mark.parametrize("main,argv,message", [
    (bench_norms.main, ["--ops", "nope"], "error: unknown ['nope']; allowed: " + str(list(bench_norms.OPS))),
    (bench_norms.main, ["--dtypes", "fp8"], "error: unknown ['fp8']; allowed: ['fp32', 'bf16', 'fp16']"),
    *[(why_normalization.main, [flag, value], f"error: {flag} must be a positive integer, got {value}")
      for flag, value in [("--layers", "0"), ("--width", "-3"), ("--batch", "0")]],
])
def test_bad_flags_are_one_line_errors(main, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main(argv))
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_why_normalization_script(tmp_path, capsys):
    why_normalization.main(["--layers", "3", "--width", "64", "--batch", "8", "--json", str(tmp_path / "why.json")])
    lines = capsys.readouterr().out.splitlines()
    assert any("std no-norm" in line and "|dW| RMSNorm" in line for line in lines)
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(len(r) == 5 for r in rows)
    data = json.loads((tmp_path / "why.json").read_text())
    assert data["config"] == {"seed": 0, "layers": 3, "width": 64, "batch": 8}
    for values in [data[net][key] for net in ["no_norm", "rmsnorm"] for key in ["std", "grad_norm"]]:
        assert len(values) == 3 and all(math.isfinite(v) and v > 0 for v in values)
    # The point of the experiment: without a norm the signal decays layer after layer; with RMSNorm every
    # ReLU sees unit-RMS input, so its output std stays near sqrt(1/2 - 1/(2 pi)) = 0.58.
    assert data["no_norm"]["std"][-1] < 0.5 * data["no_norm"]["std"][0]
    assert all(0.4 < s < 0.8 for s in data["rmsnorm"]["std"])
