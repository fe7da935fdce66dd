"""model/norms.py: each norm type against its paper's formula with every parameter drawn at random, its initial
state, the (1 + w) gain's float32 path, where DyT's and Derf's per-position alphas go, and BatchNorm's leak."""

import pytest
import torch
import torch.nn.functional as F

from model import MiniMindConfig, MiniMindForCausalLM
from model.norms import RMSNorm, make_norm
from tests.tiny import TINY, ids, tiny_model

GAINS = ["w", "one_plus_w"]
HIDDEN = TINY["hidden_size"]


def norm_of(norm_type="rmsnorm", norm_gain="w", randomize=True) -> torch.nn.Module:
    """An attention-input norm of the type; randomized: every parameter drawn at random (scalars around 1), so
    that a misplaced or ignored one would show."""
    norm = make_norm(MiniMindConfig(**TINY, norm_type=norm_type, norm_gain=norm_gain), "attn")
    if randomize:
        with torch.no_grad():
            for p in norm.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.numel() == 1 else 0.0))
    return norm


def gain(norm, norm_gain):
    return 1 + norm.weight if norm_gain == "one_plus_w" else norm.weight


def rms(x, eps=1e-5):
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_rmsnorm_is_torchs_and_keeps_float32_statistics_for_bf16():
    torch.manual_seed(0)
    x = torch.randn(4, 7, HIDDEN) * 3
    norm = RMSNorm(HIDDEN, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = F.rms_norm(x, (HIDDEN,), norm.weight, eps=1e-5)
    assert (norm(x) - ref).abs().max().item() <= 1e-6
    # a bf16 model: statistics in fp32 inside, bf16 out, within bf16 rounding of the fp32 result
    bf16 = norm.to(torch.bfloat16)(x.bfloat16())
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), ref, atol=0.05, rtol=0.02)


def test_ssnorm_has_one_gain_and_equals_rmsnorm_at_init():
    """Single-scale RMSNorm (OSP, Park et al. 2025): x / RMS(x) * g with one scalar g."""
    norm, plain = norm_of("ssnorm", randomize=False), norm_of("rmsnorm", randomize=False)
    assert sum(p.numel() for p in norm.parameters()) == 1
    x = torch.randn(3, 7, HIDDEN)
    assert torch.equal(norm(x), plain(x))
    with torch.no_grad():
        norm.weight.fill_(2.5)
    torch.testing.assert_close(norm(x), 2.5 * plain(x))


@pytest.mark.parametrize("norm_gain", GAINS)
def test_derf_is_its_formula(norm_gain):
    """Derf(x) = gamma * erf(alpha * x + s) + beta (Chen et al. 2025): alpha a scalar; s, gamma, beta per channel."""
    norm = norm_of("derf", norm_gain)
    assert (norm.alpha.shape, norm.shift.shape, norm.weight.shape, norm.bias.shape) == ((1,), *[(HIDDEN,)] * 3)
    x = torch.randn(2, 5, HIDDEN) * 3
    expected = gain(norm, norm_gain) * torch.erf(norm.alpha * x + norm.shift) + norm.bias
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_gain", GAINS)
def test_seednorm_is_its_formula(norm_gain):
    """SeeDNorm(x) = [tanh(x . beta) * alpha + gamma] * x / RMS(x) (Cai et al. 2025): x . beta one number per
    token, alpha, beta and gamma vectors, RMS(x) = sqrt(mean(x^2) + eps)."""
    norm = norm_of("seednorm", norm_gain)
    with torch.no_grad():
        norm.beta.mul_(0.2)  # x . beta of order 1, where tanh is neither linear nor saturated
    x = torch.randn(2, 5, HIDDEN) * 3
    dot = (x * norm.beta).sum(-1, keepdim=True)
    assert dot.abs().max() > 0.5  # the dynamic term matters here
    expected = (torch.tanh(dot) * norm.alpha + gain(norm, norm_gain)) * x / rms(x)
    torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)


def test_seednorm_starts_as_rmsnorm_and_learns_its_dynamic_gain():
    norm, plain = norm_of("seednorm", randomize=False), norm_of("rmsnorm", randomize=False)
    assert torch.all(norm.alpha == 1) and torch.all(norm.beta == 0) and torch.all(norm.weight == 1)
    x = torch.randn(4, 7, HIDDEN)
    assert torch.equal(norm(x), plain(x))
    (norm(x) * torch.randn_like(x)).sum().backward()
    assert norm.beta.grad.abs().max() > 0  # so tanh(x . beta) leaves 0 at the first step, and alpha then learns


def test_one_plus_w_computes_in_float32_and_casts_last():
    """Gemma's order: normalize and multiply by (1 + w) in float32, round to the input's dtype once at the end."""
    norm = norm_of("rmsnorm", "one_plus_w")
    x = (torch.randn(3, 5, HIDDEN) * 4).bfloat16()
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + norm.weight)).bfloat16()
    assert norm(x).dtype == torch.bfloat16 and torch.equal(norm(x), expected)


@pytest.mark.parametrize("norm_type", ["dyt", "derf"])
def test_dyt_and_derf_take_the_papers_alpha_per_position(norm_type):
    """DyT's LLaMA recipe sets alpha per position (attention, MLP, final norm); a norm of another position (QK-norm)
    and every one by default takes dyt_alpha_init. Derf starts at erf(0.5 x): shift 0, gain 1, bias 0."""
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type=norm_type, norm_position="peri", qk_norm="head",
                                               dyt_alpha_init=0.5, dyt_alpha_init_attn=0.8, dyt_alpha_init_mlp=0.2,
                                               dyt_alpha_init_final=0.1))
    alphas = {name.removeprefix("model.layers.2."): m.alpha.item() for name, m in model.named_modules()
              if hasattr(m, "alpha") and name.startswith(("model.layers.2.", "model.norm"))}
    assert alphas == pytest.approx({"input_layernorm": 0.8, "post_attention_layernorm": 0.8,
                                    "pre_feedforward_layernorm": 0.2, "post_feedforward_layernorm": 0.2,
                                    "model.norm": 0.1, "self_attn.q_norm": 0.5, "self_attn.k_norm": 0.5})
    plain = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type=norm_type, dyt_alpha_init=0.3))
    assert [m.alpha.item() for m in plain.modules() if hasattr(m, "alpha")] == pytest.approx([0.3] * 9)
    if norm_type == "derf":
        norm = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="derf")).model.layers[1].input_layernorm
        assert torch.all(norm.shift == 0) and torch.all(norm.weight == 1) and torch.all(norm.bias == 0)
        x = torch.randn(3, HIDDEN)
        assert torch.equal(norm(x), torch.erf(0.5 * x))


def test_batchnorm_leaks_the_future_and_the_batch_in_training_only():
    """Batch statistics mix every position and sequence: in training a later token changes an earlier logit
    and the other sequences change the first one's (test_variants.py shows no other variant does); in eval mode
    the running statistics see neither."""
    model = tiny_model(norm_type="batchnorm", norm_position="peri")
    x = ids(batch=4, seq=16)
    future, others = x.clone(), x.clone()
    future[:, 9:] = (future[:, 9:] + 7) % TINY["vocab_size"]
    others[1:] = (others[1:] + 3) % TINY["vocab_size"]
    with torch.no_grad():
        for train in (True, False):
            model.train(train)
            a, b, c = model(x).logits, model(future).logits, model(others).logits
            assert torch.equal(a[:, :9], b[:, :9]) != train
            assert torch.equal(a[0], c[0]) != train
