"""model/norms.py: each norm type against its paper's formula with every parameter drawn at random, its
initial state, the (1 + w) gain's float32 path, and DyT's and Derf's starting alpha."""

import pytest
import torch

from model import MiniMindConfig, MiniMindForCausalLM
from model.model_minimind import norm_for
from tests.tiny import TINY

HIDDEN = TINY["hidden_size"]


def norm_of(norm_type="rmsnorm", norm_gain="w", randomize=True) -> torch.nn.Module:
    """An attention-input norm of the type, in training mode; randomized: every parameter drawn at random
    (scalars around 1), so that a misplaced or ignored one would show."""
    norm = norm_for(MiniMindConfig(**TINY, norm_type=norm_type, norm_gain=norm_gain))
    if randomize:
        with torch.no_grad():
            for p in norm.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.numel() == 1 else 0.0))
    return norm


def rms(x, eps=1e-5):
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def standardized(x):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)


# norm type -> its paper's formula of the input x, the norm n and its gain g (n.weight, or 1 + n.weight)
FORMULAS = {
    "rmsnorm": lambda x, n, g: x / rms(x) * g,  # Zhang & Sennrich 2019
    "ssnorm": lambda x, n, g: x / rms(x) * g,  # OSP, Park et al. 2025: g one scalar
    "layernorm": lambda x, n, g: standardized(x) * g + n.bias,
    "dyt": lambda x, n, g: g * torch.tanh(n.alpha * x) + n.bias,  # Zhu et al. 2025: alpha one scalar
    "derf": lambda x, n, g: g * torch.erf(n.alpha * x + n.shift) + n.bias,  # Chen et al. 2025
    # Cai et al. 2025: x . beta one number per token; alpha, beta and g vectors
    "seednorm": lambda x, n, g: (torch.tanh((x * n.beta).sum(-1, keepdim=True)) * n.alpha + g) * x / rms(x),
}
SCALARS = {("dyt", "alpha"), ("derf", "alpha"), ("ssnorm", "weight")}


@pytest.mark.parametrize("norm_gain", ["w", "one_plus_w"])
@pytest.mark.parametrize("norm_type", FORMULAS)
def test_every_norm_is_its_papers_formula(norm_type, norm_gain):
    norm = norm_of(norm_type, norm_gain)
    for name, p in norm.named_parameters():  # one scalar alpha (DyT, Derf) or gain (SSNorm), else a vector
        assert p.shape == ((1,) if (norm_type, name) in SCALARS else (HIDDEN,)), name
    x = torch.randn(2, 5, HIDDEN) * 3
    if norm_type == "seednorm":
        with torch.no_grad():
            norm.beta.mul_(0.2)  # x . beta of order 1, where tanh is neither linear nor saturated
        assert (x * norm.beta).sum(-1).abs().max() > 0.5  # the dynamic term matters here
    gain = 1 + norm.weight if norm_gain == "one_plus_w" else norm.weight
    torch.testing.assert_close(norm(x), FORMULAS[norm_type](x, norm, gain), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_type", ["ssnorm", "seednorm"])
def test_ssnorm_and_seednorm_start_as_rmsnorm_exactly_and_seednorm_learns_its_dynamic_gain(norm_type):
    norm, plain = norm_of(norm_type, randomize=False), norm_of("rmsnorm", randomize=False)
    x = torch.randn(4, 7, HIDDEN)
    assert torch.equal(norm(x), plain(x))
    if norm_type == "seednorm":  # beta = 0 makes tanh(x . beta) = 0; alpha = 1 gives beta a gradient
        (norm(x) * torch.randn_like(x)).sum().backward()
        assert norm.beta.grad.abs().max() > 0


def test_one_plus_w_computes_in_float32_and_casts_last():
    """Gemma's order: normalize and multiply by (1 + w) in float32, round to the input's dtype once, last."""
    norm = norm_of("rmsnorm", "one_plus_w")
    x = (torch.randn(3, 5, HIDDEN) * 4).bfloat16()
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + norm.weight)).bfloat16()
    assert norm(x).dtype == torch.bfloat16 and torch.equal(norm(x), expected)


@pytest.mark.parametrize("norm_type", ["dyt", "derf"])
def test_dyt_and_derf_start_every_norm_at_the_alpha_given(norm_type):
    """Every norm, QK-norms too, starts at dyt_alpha_init; Derf at erf(0.5 x), its shift and bias 0."""
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type=norm_type, norm_position="peri",
                                               qk_norm="head", dyt_alpha_init=0.3))
    alphas = [m.alpha.item() for m in model.modules() if hasattr(m, "alpha")]
    assert alphas == pytest.approx([0.3] * (4 * 6 + 1))  # 4 blocks of 4 sandwich norms and q, k; the final
    if norm_type == "derf":
        norm = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="derf")).model.layers[1].input_layernorm
        x = torch.randn(3, HIDDEN)
        assert torch.equal(norm(x), torch.erf(0.5 * x))


def test_layernorm_computes_what_torchs_module_does():
    """Same state_dict, same outputs and gradients."""
    norm, torch_norm = norm_of("layernorm"), torch.nn.LayerNorm(HIDDEN)
    assert norm.state_dict().keys() == torch_norm.state_dict().keys()
    torch_norm.load_state_dict(norm.state_dict())
    x = torch.randn(3, 7, HIDDEN) * 2 + 0.5
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = norm(ours), torch_norm(theirs)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward(), expected.pow(2).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
