"""The 2025-26 norm-plan additions checked against what their formulas imply: HybridNorm(*), sub-norms,
embedding normalization and (1 + w) gains, Derf, SeeDNorm, ReZero, logit soft-capping and the nanochat recipe. The
reference forward for the placements is in test_norm_plan.py; Derf's and SeeDNorm's formulas are written out here."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import model.model_minimind as mm
from model import MiniMindConfig, MiniMindForCausalLM, count_norms, norm_variant
from study.variants import variant_fields
from tests.test_norm_plan import docstring_counts, placed
from tests.tiny import FIXTURES, TINY, assert_bf16_autocast_trains, assert_saved_logits, ids, tiny_model
from trainer.optim import build_optimizer

GAIN_TYPES = [name for name, kind in mm.NORM_TYPES.items() if kind.gain]
NEW_FIELDS = ("sub_norm", "embed_norm", "norm_gain")


@pytest.mark.parametrize("norm_gain", mm.NORM_GAINS)
@pytest.mark.parametrize("embed_norm", mm.EMBED_NORMS)
@pytest.mark.parametrize("sub_norm", [False, True])
@pytest.mark.parametrize("position", mm.NORM_POSITIONS)
def test_norm_count_of_every_new_combination(position, sub_norm, embed_norm, norm_gain):
    config = MiniMindConfig(**{**TINY, "num_hidden_layers": 8}, **placed(position, sub_norm=sub_norm,
                                                                            embed_norm=embed_norm, norm_gain=norm_gain))
    # the docstring's count, 2 sub-norms per block, 1 embedding norm; a (1 + w) gain adds no module
    expected = docstring_counts()[position] + (16 if sub_norm else 0) + (embed_norm == "norm")
    assert count_norms(MiniMindForCausalLM(config)) == expected


def test_new_modules_have_the_hugging_face_names_and_widths():
    state = MiniMindForCausalLM(MiniMindConfig(**TINY, sub_norm=True, embed_norm="norm")).state_dict()
    heads = TINY["num_attention_heads"] * (TINY["hidden_size"] // TINY["num_attention_heads"])
    assert state["model.layers.2.self_attn.attn_sub_norm.weight"].shape == (heads,)
    assert state["model.layers.2.mlp.ffn_sub_norm.weight"].shape == (MiniMindConfig(**TINY).intermediate_size,)
    assert state["model.word_embeddings_layernorm.weight"].shape == (TINY["hidden_size"],)
    hybrid = {k for k in MiniMindForCausalLM(MiniMindConfig(**TINY, **placed("hybrid"))).state_dict()
              if k.startswith("model.layers.1.") and "norm" in k}
    assert hybrid == {f"model.layers.1.{n}.weight" for n in (
        "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm", "self_attn.v_norm")}  # no MLP norm


def test_hybrid_star_with_one_layer_is_pre_with_qkv_norm():
    star = tiny_model(num_hidden_layers=1, **placed("hybrid_star"))
    pre = MiniMindForCausalLM(MiniMindConfig(**{**TINY, "num_hidden_layers": 1}, qk_norm="head", v_norm="head"))
    pre.load_state_dict(star.state_dict())  # strict: the same modules under the same names
    with torch.no_grad():
        assert torch.equal(pre.eval()(ids()).logits, star(ids()).logits)


def test_hybrid_hands_each_block_after_attention_a_normalized_stream():
    """N(x + Attn(x)) with unit gains: the MLP of every block sees an input of RMS 1 (up to eps, made tiny: the
    first block's sum has an RMS near 0.02, where eps = 1e-5 would still show)."""
    model = tiny_model(perturb=False, rms_norm_eps=1e-12, **placed("hybrid"))
    seen = []
    for layer in model.model.layers:
        layer.mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(ids())
    for h in seen:
        torch.testing.assert_close(h.pow(2).mean(-1).sqrt(), torch.ones(h.shape[:-1]), atol=1e-3, rtol=0)


def test_sub_norm_makes_the_block_invariant_to_the_value_and_up_scale():
    """attn_sub_norm normalizes the heads' output, so v_proj's scale cannot reach o_proj; ffn_sub_norm does the
    same for up_proj's scale (the SwiGLU product is linear in it)."""
    def logits_after_scaling(model):
        with torch.no_grad():
            before = model(ids()).logits
            for layer in model.model.layers:
                layer.self_attn.v_proj.weight.mul_(10)
                layer.mlp.up_proj.weight.mul_(10)
            return before, model(ids()).logits

    before, after = logits_after_scaling(tiny_model(sub_norm=True, rms_norm_eps=1e-12))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    before, after = logits_after_scaling(tiny_model(rms_norm_eps=1e-12))
    assert (after - before).abs().max() > 1e-3


def test_embed_scale_multiplies_the_lookup_by_sqrt_hidden():
    model = tiny_model(embed_norm="scale")
    with torch.no_grad():
        stream = model.model(ids(), output_hidden_states=True).hidden_states[0]
    assert torch.equal(stream, model.model.embed_tokens(ids()) * torch.tensor(TINY["hidden_size"] ** 0.5))


@pytest.mark.parametrize("norm_type", GAIN_TYPES)
def test_one_plus_w_at_zero_is_bit_identical_to_unit_gains(norm_type):
    """Same seed, so the same weight draws; w = 0 under (1 + w) against gains of 1: the same fp32 forward and the
    same gradients, bit for bit, in every slot (block norms, QK-norm, sub-norms, embedding norm, final norm)."""
    def run(norm_gain):
        torch.manual_seed(0)
        model = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type=norm_type, norm_gain=norm_gain,
                                                   norm_position="peri", qk_norm="head", v_norm="head",
                                                   sub_norm=True, embed_norm="norm")).train()
        x = ids(seq=16)
        out = model(x[:, :-1], shift_labels=x[:, 1:])
        out.loss.backward()
        return model, out.logits

    plain, plain_logits = run("w")
    centred, centred_logits = run("one_plus_w")
    assert torch.equal(plain_logits, centred_logits)
    gains = [name for name, m in centred.named_modules() if isinstance(m, mm.NORM_MODULES)]
    assert gains and all(torch.all(centred.get_submodule(n).weight == 0) for n in gains)
    assert all(torch.all(plain.get_submodule(n).weight == 1) for n in gains)
    for (name, p), q in zip(plain.named_parameters(), centred.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("norm_type", ["rmsnorm", "ssnorm", "layernorm"])
def test_weight_decay_pulls_a_one_plus_w_gain_to_one_and_a_plain_gain_to_zero(norm_type):
    """One AdamW step with a zero gradient and --norm_weight_decay: only the decay moves anything."""
    lr, decay = 0.1, 0.5
    gains = {}
    for norm_gain in mm.NORM_GAINS:
        model = tiny_model(perturb=False, norm_type=norm_type, norm_gain=norm_gain)
        optimizer = build_optimizer(model, lr=lr, weight_decay=decay, norm_weight_decay=True)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        norm = model.model.layers[0].input_layernorm
        gains[norm_gain] = (1 + norm.weight if norm_gain == "one_plus_w" else norm.weight).detach()
    torch.testing.assert_close(gains["w"], torch.full_like(gains["w"], 1 - lr * decay))
    assert torch.equal(gains["one_plus_w"], torch.ones_like(gains["one_plus_w"]))


def test_one_plus_w_computes_in_float32_and_casts_last():
    """Gemma's order: normalize and multiply by (1 + w) in float32, round to the input's dtype once at the end."""
    norm = mm.make_norm(MiniMindConfig(**TINY, norm_gain="one_plus_w"), "attn")
    with torch.no_grad():
        norm.weight.copy_(torch.randn(TINY["hidden_size"]) * 0.3)
    x = (torch.randn(3, 5, TINY["hidden_size"]) * 4).bfloat16()
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + norm.weight)).bfloat16()
    assert norm(x).dtype == torch.bfloat16
    assert torch.equal(norm(x), expected)


@pytest.mark.parametrize("overrides,words", [
    ({"norm_position": "hybrid", "qk_norm": "none"}, ("norm_position", "qk_norm")),
    ({"norm_position": "hybrid_star", "qk_norm": "head", "v_norm": "none"}, ("norm_position", "v_norm")),
    ({"norm_position": "hybrid", "qk_norm": "proj", "v_norm": "head"}, ("qk_norm",)),
    ({"sub_norm": True, "norm_type": "none"}, ("sub_norm",)),
    ({"embed_norm": "norm", "norm_type": "none"}, ("embed_norm",)),
    ({"embed_norm": "sqrt_d"}, ("embed_norm",)),
    ({"norm_gain": "one_plus_w", "norm_type": "rmsnorm_noparam"}, ("norm_gain", "norm_type")),
    ({"norm_gain": "one"}, ("norm_gain",)),
    ({"sub_norm": "yes"}, ("sub_norm",))])
def test_bad_values_name_the_field(overrides, words):
    with pytest.raises(ValueError) as err:
        MiniMindConfig(**TINY, **overrides)
    assert all(word in str(err.value) for word in words), str(err.value)


def test_embed_scale_without_norms_is_allowed():
    assert MiniMindConfig(**TINY, embed_norm="scale", norm_type="none").embed_norm == "scale"


def test_configs_without_the_new_fields_load_as_before(tmp_path):
    """A checkpoint saved before these fields existed gets their defaults: the model it was."""
    name = sorted(p.name for p in FIXTURES.iterdir())[0]
    saved = json.loads((FIXTURES / name / "config.json").read_text())
    assert not set(NEW_FIELDS) & set(saved)
    config = MiniMindConfig.from_pretrained(FIXTURES / name)
    assert (config.sub_norm, config.embed_norm, config.norm_gain) == (False, "none", "w")
    expected = torch.load(FIXTURES / name / "expected.pt")
    loaded = MiniMindForCausalLM.from_pretrained(FIXTURES / name).eval()
    with torch.no_grad():
        assert_saved_logits(loaded(expected["input_ids"]).logits, expected["logits"])


@pytest.mark.parametrize("norm_type", GAIN_TYPES)
def test_bf16_autocast_forward_backward_with_one_plus_w(norm_type):
    assert_bf16_autocast_trains(tiny_model(norm_type=norm_type, norm_gain="one_plus_w", sub_norm=True,
                                           embed_norm="norm", **placed("hybrid")).train())


@pytest.mark.parametrize("overrides,word", [
    ({"sub_norm": True}, "sub_norm"), ({"embed_norm": "norm"}, "embed_norm"),
    ({"norm_gain": "one_plus_w"}, "norm_gain"), ({"embed_norm": "scale"}, "embed_norm"),
    ({"norm_position": "peri", "norm_gain": "one_plus_w"}, "embed_norm"),
    ({"norm_position": "peri", "embed_norm": "scale"}, "norm_gain"),
    ({"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale", "norm_type": "ssnorm"}, "norm_type"),
    ({"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale", "qk_norm": "proj"}, "qk_norm"),
    (placed("hybrid"), "v_norm"), ({"norm_type": "derf"}, "erf"), ({"norm_type": "seednorm"}, "SeeDNorm"),
    ({"norm_position": "rezero"}, "no norms"), ({"norm_position": "rezero", "norm_type": "none"}, "rezero"),
    ({"logit_softcap": 30.0}, "logit_softcap"), ({"qk_norm": "head", "logit_softcap": 30.0}, "qwen3")])
def test_export_refuses_what_no_family_computes(overrides, word):
    from model.hf_export import hf_family
    with pytest.raises(ValueError) as err:
        hf_family(MiniMindConfig(**TINY, **overrides))
    assert word in str(err.value) and "\n" not in str(err.value)


def test_gguf_refuses_the_gemma_families(tmp_path):
    from common.cli import UserError
    from scripts import convert_to_gguf
    tiny_model(perturb=False, norm_position="peri", norm_gain="one_plus_w", embed_norm="scale").save_pretrained(
        tmp_path / "src")
    with pytest.raises(UserError, match="gemma2 model has no GGUF export"):
        convert_to_gguf.convert(tmp_path / "src", tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("centred", [True, False])
def test_pre_layernorm_equals_pre_rmsnorm_on_a_zero_mean_stream(centred):
    """Jiang et al. (2023): when everything written into the residual stream (the embeddings, o_proj, down_proj) has
    zero mean over the hidden dimension, the stream does too, LayerNorm without bias is RMSNorm, and Pre-LN and
    Pre-RMSNorm models with the same weights give the same logits (fp64; measured 8e-8 apart, RMSNorm's float32
    statistics). Without the centring they do not (measured 0.16 apart)."""
    rms = tiny_model(seed=4).double()
    if centred:
        with torch.no_grad():
            rms.model.embed_tokens.weight.sub_(rms.model.embed_tokens.weight.mean(-1, keepdim=True))
            for layer in rms.model.layers:
                for writer in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    writer.weight.sub_(writer.weight.mean(0, keepdim=True))  # each column sums to 0 over outputs
    ln = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="layernorm")).double().eval()
    missing, unexpected = ln.load_state_dict(rms.state_dict(), strict=False)
    assert not unexpected and missing and all(k.endswith("norm.bias") for k in missing)
    with torch.no_grad():
        for name in missing:
            ln.get_parameter(name).zero_()
        a, b = rms(ids()).logits, ln(ids()).logits
    gap = (a - b).abs().max().item()
    # RMSNorm takes its statistics in float32 even for fp64 input (model/rmsnorm_kernels.py): equal up to that
    assert gap < 1e-6 if centred else gap > 1e-3


# ---------------------------------------------------------------------------------------------------------
# Derf, SeeDNorm, ReZero and logit soft-capping, each against its paper's formula


def randomized(norm: torch.nn.Module) -> torch.nn.Module:
    """The norm with every parameter drawn at random, so that a misplaced or ignored one would show."""
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.ndim == 1 and p.numel() == 1 else 0.0))
    return norm


@pytest.mark.parametrize("norm_gain", mm.NORM_GAINS)
def test_derf_is_its_formula(norm_gain):
    """Derf(x) = gamma * erf(alpha * x + s) + beta (Chen et al. 2025): alpha a scalar; s, gamma, beta per channel."""
    norm = randomized(mm.make_norm(MiniMindConfig(**TINY, norm_type="derf", norm_gain=norm_gain), "attn"))
    assert (norm.alpha.shape, norm.shift.shape, norm.weight.shape, norm.bias.shape) == (
        (1,), *[(TINY["hidden_size"],)] * 3)
    x = torch.randn(2, 5, TINY["hidden_size"]) * 3
    gamma = 1 + norm.weight if norm_gain == "one_plus_w" else norm.weight
    expected = gamma * torch.erf(norm.alpha * x + norm.shift) + norm.bias
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-6)


def test_derf_starts_at_the_papers_init_and_takes_dyts_per_position_alpha():
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="derf", dyt_alpha_init_mlp=0.2))
    norm, mlp_norm = model.model.layers[1].input_layernorm, model.model.layers[1].post_attention_layernorm
    assert norm.alpha.item() == 0.5 and mlp_norm.alpha.item() == pytest.approx(0.2)
    assert torch.all(norm.shift == 0) and torch.all(norm.weight == 1) and torch.all(norm.bias == 0)
    x = torch.randn(3, TINY["hidden_size"])
    assert torch.equal(norm(x), torch.erf(0.5 * x))


@pytest.mark.parametrize("norm_gain", mm.NORM_GAINS)
def test_seednorm_is_its_formula(norm_gain):
    """SeeDNorm(x) = [tanh(x . beta) * alpha + gamma] * x / RMS(x) (Cai et al. 2025): x . beta one number per
    token, alpha, beta and gamma vectors, RMS(x) = sqrt(mean(x^2) + eps)."""
    norm = randomized(mm.make_norm(MiniMindConfig(**TINY, norm_type="seednorm", norm_gain=norm_gain), "attn"))
    with torch.no_grad():
        norm.beta.mul_(0.2)  # x . beta of order 1, where tanh is neither linear nor saturated
    x = torch.randn(2, 5, TINY["hidden_size"]) * 3
    gamma = 1 + norm.weight if norm_gain == "one_plus_w" else norm.weight
    dot = (x * norm.beta).sum(-1, keepdim=True)
    expected = (torch.tanh(dot) * norm.alpha + gamma) * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert dot.abs().max() > 0.5  # the dynamic term matters here
    torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)


def test_seednorm_starts_as_rmsnorm_and_learns_its_dynamic_gain():
    cfg = MiniMindConfig(**TINY, norm_type="seednorm")
    norm, plain = mm.make_norm(cfg, "attn"), mm.make_norm(MiniMindConfig(**TINY), "attn")
    assert torch.all(norm.alpha == 1) and torch.all(norm.beta == 0) and torch.all(norm.weight == 1)
    x = torch.randn(4, 7, TINY["hidden_size"])
    assert torch.equal(norm(x), plain(x))
    (norm(x) * torch.randn_like(x)).sum().backward()
    assert norm.beta.grad.abs().max() > 0  # so tanh(x . beta) leaves 0 at the first step, and alpha then learns


def test_rezero_is_the_identity_at_init_and_its_scales_learn():
    """x + a * F(x) with a = 0: every block hands on its input unchanged, there is no norm, the logits are the
    embedding times lm_head; the scales get gradients, the sublayers' weights none until they move."""
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_position="rezero")).train()
    assert count_norms(model) == 0 and isinstance(model.model.norm, torch.nn.Identity)
    x = ids(seq=12)
    out = model(x[:, :-1], shift_labels=x[:, 1:], output_hidden_states=True)
    embedded = model.model.embed_tokens(x[:, :-1])
    assert all(torch.equal(h, embedded) for h in out.hidden_states)
    torch.testing.assert_close(out.logits, embedded @ model.lm_head.weight.T)
    out.loss.backward()
    for layer in model.model.layers:
        assert layer.attn_residual_scale.grad.abs().item() > 0 and layer.mlp_residual_scale.grad.abs().item() > 0
        assert torch.all(layer.self_attn.q_proj.weight.grad == 0)
    assert norm_variant(model.config) == "rezero"
    assert norm_variant(MiniMindConfig(**TINY, norm_position="rezero", qk_norm="head")) == "rezero+qk_head-rmsnorm"


def test_logit_softcap_bounds_the_logits_and_is_its_formula():
    """logits = C * tanh(z / C), in float32, with z what the model computes without the cap."""
    capped = tiny_model(logit_softcap=0.5)
    plain = MiniMindForCausalLM(MiniMindConfig(**TINY)).eval()
    plain.load_state_dict(capped.state_dict())
    with torch.no_grad():
        for model in (capped, plain):
            model.lm_head.weight.mul_(100)  # logits far beyond the cap (lm_head is tied: the embedding too)
        x = ids()
        z, logits = plain(x).logits, capped(x).logits
        # within (-C, C), up to float32's rounding of tanh to +-1 far out (|z / C| > 9)
        assert z.abs().max() > 5 and logits.abs().max() <= 0.5 and torch.all(logits[z.abs() < 2.5].abs() < 0.5)
        assert torch.equal(logits, 0.5 * torch.tanh(z / 0.5))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert capped(x).logits.dtype == torch.float32
    loss = capped(x[:, :-1], shift_labels=x[:, 1:]).loss  # the loss is taken on the capped logits
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    torch.testing.assert_close(loss, expected)
    assert norm_variant(capped.config) == "pre+softcap0.5-rmsnorm"


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan])
def test_a_bad_softcap_names_the_field(value):
    with pytest.raises(ValueError, match="logit_softcap"):
        MiniMindConfig(**TINY, logit_softcap=value)


def test_nanochat_is_its_recipe():
    """Parameter-free RMSNorm before each sublayer, per head on q and k, after the embedding and before lm_head;
    Pre-Norm; logits capped at 15. The model calls itself by the recipe's name."""
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, **variant_fields("nanochat")))
    layers = TINY["num_hidden_layers"]
    assert count_norms(model) == 2 * layers + 2 * layers + 1 + 1
    assert not [n for n, p in model.named_parameters() if "norm" in n]  # no gains anywhere
    assert (model.config.norm_position, model.config.qk_norm, model.config.logit_softcap) == ("pre", "head", 15.0)
    assert norm_variant(model.config) == "nanochat"
