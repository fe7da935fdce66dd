"""The norm plan: every placement against its formula written out here, the reductions between placements,
QK-norm, DeepNorm's init, DyT's per-position alpha and BatchNorm's leak."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoModelForCausalLM,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    LlamaForCausalLM,
    Olmo2ForCausalLM,
    Qwen3ForCausalLM,
)

import model.model_minimind as mm
from common.cli import UserError
from model import NORM_POSITIONS, NORM_TYPES, QK_NORMS, MiniMindConfig, MiniMindForCausalLM, count_norms
from model.model_minimind import QKV_PLACEMENTS
from tests.tiny import FIXTURES, TINY, assert_bf16_autocast_trains, assert_saved_logits, ids, tiny_model

REPO = Path(__file__).resolve().parents[1]
CONVERT = str(REPO / "scripts" / "convert_to_hf.py")


def placed(position, **overrides):
    """Config fields for a placement; HybridNorm's placements come with the QKV-norm they require."""
    qkv = {"qk_norm": "head", "v_norm": "head"} if position in QKV_PLACEMENTS else {}
    return {"norm_position": position, **overrides, **qkv}


# ---------------------------------------------------------------------------------------------------------
# Counts, against the table in the model file's docstring


def docstring_counts() -> dict[str, int]:
    rows = re.findall(r"^  (\w+) .*\s(\d+)$", mm.__doc__, flags=re.MULTILINE)
    return {name: int(n) for name, n in rows if name in NORM_POSITIONS}


def test_docstring_table_lists_every_placement():
    assert set(docstring_counts()) == set(NORM_POSITIONS)


@pytest.mark.parametrize("qk_norm", QK_NORMS)
@pytest.mark.parametrize("norm_type", sorted(NORM_TYPES))
@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_norm_count(position, norm_type, qk_norm):
    hybrid = {"v_norm": "head"} if position in QKV_PLACEMENTS else {}  # the docstring counts its q/k/v norms
    if (qk_norm != "none" or hybrid) and norm_type == "none" or hybrid and qk_norm != "head":
        with pytest.raises(ValueError, match="qk_norm|v_norm"):
            MiniMindConfig(**TINY, norm_position=position, norm_type=norm_type, qk_norm=qk_norm, **hybrid)
        return
    model = MiniMindForCausalLM(MiniMindConfig(**{**TINY, "num_hidden_layers": 8}, norm_position=position,
                                               norm_type=norm_type, qk_norm=qk_norm, **hybrid))
    expected = 0 if norm_type == "none" else docstring_counts()[position] + (16 if qk_norm != "none" and not hybrid
                                                                             else 0)
    assert count_norms(model) == expected


def test_module_names_follow_each_family():
    def names(**kw):
        return {k for k in MiniMindForCausalLM(MiniMindConfig(**TINY, **kw)).state_dict() if ".layers.1." in k
                and "norm" in k}
    layer = "model.layers.1."
    assert names() == {layer + "input_layernorm.weight", layer + "post_attention_layernorm.weight"}
    assert names(norm_position="peri") == {layer + n + ".weight" for n in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")}
    assert names(norm_position="reorder", qk_norm="proj") == {layer + n + ".weight" for n in (
        "post_attention_layernorm", "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")}
    assert names(norm_position="deepnorm") == names(norm_position="post")
    # Mix-LN at 4 layers: block 0 is Post-Norm, blocks 1..3 Pre-Norm
    assert names(norm_position="mix") == names()
    mix = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_position="mix")).state_dict()
    assert "model.layers.0.post_feedforward_layernorm.weight" in mix and "model.norm.weight" in mix


# ---------------------------------------------------------------------------------------------------------
# Every placement against an independent reference forward (plain tensor ops on the model's weights)


def ref_rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_rope(x, theta=1e6):
    """Rotate-half RoPE on [batch, heads, seq, dim], positions 0..seq-1."""
    dim, seq = x.shape[-1], x.shape[-2]
    angles = torch.arange(seq)[:, None].float() / theta ** (torch.arange(0, dim, 2).float() / dim)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def ref_norm(h, w, name, cfg):
    """RMSNorm with the gain stored under name: w as stored, or 1 + w for norm_gain='one_plus_w'."""
    gain = w[name + ".weight"]
    return ref_rmsnorm(h, 1 + gain if cfg.norm_gain == "one_plus_w" else gain)


def ref_attention(x, w, prefix, cfg):
    b, t, _ = x.shape
    H, K, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, k, v = (x @ w[f"{prefix}.{n}_proj.weight"].T for n in "qkv")
    if cfg.qk_norm == "proj":
        q, k = ref_norm(q, w, f"{prefix}.q_norm", cfg), ref_norm(k, w, f"{prefix}.k_norm", cfg)
    q, k, v = q.view(b, t, H, D), k.view(b, t, K, D), v.view(b, t, K, D)
    if cfg.qk_norm == "head":
        q, k = ref_norm(q, w, f"{prefix}.q_norm", cfg), ref_norm(k, w, f"{prefix}.k_norm", cfg)
    if cfg.v_norm == "head":
        v = ref_norm(v, w, f"{prefix}.v_norm", cfg)
    q, k = ref_rope(q.transpose(1, 2)), ref_rope(k.transpose(1, 2))
    k, v = k.repeat_interleave(H // K, 1), v.transpose(1, 2).repeat_interleave(H // K, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, H * D)
    if cfg.sub_norm:  # Sub-LN: the concatenated heads normalized before o_proj
        out = ref_norm(out, w, f"{prefix}.attn_sub_norm", cfg)
    return out @ w[f"{prefix}.o_proj.weight"].T


def ref_mlp(x, w, prefix, cfg):
    gate, up = x @ w[f"{prefix}.gate_proj.weight"].T, x @ w[f"{prefix}.up_proj.weight"].T
    h = F.silu(gate) * up
    if cfg.sub_norm:  # Sub-LN: the SwiGLU product normalized before down_proj
        h = ref_norm(h, w, f"{prefix}.ffn_sub_norm", cfg)
    return h @ w[f"{prefix}.down_proj.weight"].T


def ref_forward(model, input_ids):
    """The placements' formulas, written out block by block."""
    cfg, w = model.config, model.state_dict()
    L = cfg.num_hidden_layers
    x = w["model.embed_tokens.weight"][input_ids]
    if cfg.embed_norm == "scale":  # Gemma
        x = x * math.sqrt(cfg.hidden_size)
    elif cfg.embed_norm == "norm":  # BLOOM
        x = ref_norm(x, w, "model.word_embeddings_layernorm", cfg)
    for i in range(L):
        p = f"model.layers.{i}."

        def N(name, h, p=p):
            return ref_norm(h, w, p + name, cfg)

        def A(h, p=p):
            return ref_attention(h, w, p + "self_attn", cfg)

        def M(h, p=p):
            return ref_mlp(h, w, p + "mlp", cfg)

        position = cfg.norm_position
        if position == "mix":
            position = "post" if i < math.floor(cfg.mix_ln_fraction * L) else "pre"
        if position == "hybrid_star":  # HybridNorm*: a Pre-Norm first block
            position = "pre" if i == 0 else "hybrid"
        s = 1 / math.sqrt(i + 1) if cfg.norm_scaling == "depth" else 1.0
        if position == "pre":  # x + F(N(x))
            x = x + A(N("input_layernorm", x) * s)
            x = x + M(N("post_attention_layernorm", x) * s)
        elif position == "post":  # N(x + F(x))
            x = N("post_attention_layernorm", x + A(x))
            x = N("post_feedforward_layernorm", x + M(x))
        elif position == "peri":  # x + N_out(F(N_in(x)))
            x = x + N("post_attention_layernorm", A(N("input_layernorm", x)))
            x = x + N("post_feedforward_layernorm", M(N("pre_feedforward_layernorm", x)))
        elif position == "reorder":  # x + N(F(x))
            x = x + N("post_attention_layernorm", A(x))
            x = x + N("post_feedforward_layernorm", M(x))
        elif position == "deepnorm":  # N(alpha x + F(x)), alpha = (2L)^(1/4)
            alpha = (2 * L) ** 0.25
            x = N("post_attention_layernorm", alpha * x + A(x))
            x = N("post_feedforward_layernorm", alpha * x + M(x))
        elif position == "hybrid":  # N(x + Attn(x)) with q, k, v normalized in Attn, then h + FFN(h)
            x = N("post_attention_layernorm", x + A(x))
            x = x + M(x)
        elif position == "rezero":  # x + a * F(x), no norm
            x = x + w[p + "attn_residual_scale"] * A(x)
            x = x + w[p + "mlp_residual_scale"] * M(x)
    if cfg.norm_position not in ("post", "deepnorm", "rezero"):
        x = N("model.norm", x, p="")
    logits = x @ w["lm_head.weight"].T
    if cfg.logit_softcap:  # C * tanh(z / C)
        logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
    return logits


@pytest.mark.parametrize("overrides", [
    *(placed(p) for p in NORM_POSITIONS),
    {"norm_position": "mix", "mix_ln_fraction": 0.5},
    {"norm_scaling": "depth"}, {"norm_position": "mix", "norm_scaling": "depth"},
    {"qk_norm": "head"}, {"qk_norm": "proj"}, {"norm_position": "reorder", "qk_norm": "proj"},
    {"norm_position": "peri", "qk_norm": "head"},
    {"qk_norm": "head", "v_norm": "head"}, placed("hybrid", sub_norm=True), {"sub_norm": True},
    {"norm_position": "post", "sub_norm": True}, {"embed_norm": "scale"}, {"embed_norm": "norm"},
    placed("hybrid_star", norm_gain="one_plus_w", embed_norm="norm"),
    {"norm_position": "peri", "qk_norm": "head", "embed_norm": "scale", "norm_gain": "one_plus_w"},
    {"norm_position": "rezero", "qk_norm": "head", "sub_norm": True}, {"logit_softcap": 2.0},
], ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_logits_match_reference_forward(overrides):
    model = tiny_model(**overrides)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ref_forward(model, x), atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# Reductions: each new placement collapses to an old one where its formula says it must


def logits_with_weights_of(source, **overrides):
    target = MiniMindForCausalLM(MiniMindConfig(**{**TINY, **overrides})).eval()
    target.load_state_dict(source.state_dict())
    with torch.no_grad():
        return target(ids()).logits


def test_mix_with_fraction_zero_is_pre():
    pre = tiny_model()
    with torch.no_grad():
        assert torch.equal(logits_with_weights_of(pre, norm_position="mix", mix_ln_fraction=0.0), pre(ids()).logits)


def test_mix_with_fraction_one_is_post_plus_final_norm():
    mix = tiny_model(norm_position="mix", mix_ln_fraction=1.0)
    h = mix.model(ids()).last_hidden_state
    post = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_position="post")).eval()
    post.load_state_dict(mix.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(h, mix.model.norm(post.model(ids()).last_hidden_state))


def test_deepnorm_with_unit_alpha_beta_is_post():
    post = tiny_model(norm_position="post")
    with torch.no_grad():
        expected = post(ids()).logits
    got = logits_with_weights_of(post, norm_position="deepnorm", deepnorm_alpha=1.0, deepnorm_beta=1.0)
    assert torch.equal(got, expected)
    # and the initialization is then Post-Norm's too
    fresh = [tiny_model(seed=3, perturb=False, **kw).state_dict() for kw in (
        {"norm_position": "post"}, {"norm_position": "deepnorm", "deepnorm_alpha": 1.0, "deepnorm_beta": 1.0})]
    assert all(torch.equal(fresh[0][k], fresh[1][k]) for k in fresh[0])


def test_deepnorm_scales_the_init_of_v_o_and_mlp_only():
    L = 8
    deep = tiny_model(seed=3, perturb=False, norm_position="deepnorm", num_hidden_layers=L).state_dict()
    post = tiny_model(seed=3, perturb=False, norm_position="post", num_hidden_layers=L).state_dict()
    beta = (8 * L) ** -0.25
    scaled = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for key in post:
        if any(s in key for s in scaled):
            torch.testing.assert_close(deep[key], post[key] * beta)  # same draws, times beta
        else:
            assert torch.equal(deep[key], post[key]), key
    assert mm.layer_plans(MiniMindConfig(**{**TINY, "num_hidden_layers": L}, norm_position="deepnorm"))[0].skip_scale \
        == pytest.approx((2 * L) ** 0.25)


def test_depth_scaling_leaves_block_one_as_pre_and_scales_later_blocks():
    pre = tiny_model()
    scaled = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_scaling="depth")).eval()
    scaled.load_state_dict(pre.state_dict())
    with torch.no_grad():
        a = pre.model(ids(), output_hidden_states=True).hidden_states
        b = scaled.model(ids(), output_hidden_states=True).hidden_states
    assert torch.equal(a[1], b[1])  # the output of block 1 (scale 1/sqrt(1))
    assert not torch.allclose(a[2], b[2])
    plans = mm.layer_plans(scaled.config)
    assert [p.input_scale for p in plans] == pytest.approx([1 / math.sqrt(n) for n in range(1, 5)])


@pytest.mark.parametrize("qk_norm", ["head", "proj"])
def test_qk_norm_makes_logits_invariant_to_query_scale(qk_norm):
    def logits_after_scaling_wq(model):
        with torch.no_grad():
            before = model(ids()).logits
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(10)
            return before, model(ids()).logits

    before, after = logits_after_scaling_wq(tiny_model(qk_norm=qk_norm, perturb=False))
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    before, after = logits_after_scaling_wq(tiny_model(perturb=False))
    assert (after - before).abs().max() > 1e-3  # without QK-norm the same change does show


def test_dyt_alpha_per_position():
    model = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="dyt", norm_position="peri", qk_norm="head",
                                               dyt_alpha_init=0.5, dyt_alpha_init_attn=0.8, dyt_alpha_init_mlp=0.2,
                                               dyt_alpha_init_final=0.1))
    alphas = {name: m.alpha.item() for name, m in model.named_modules() if hasattr(m, "alpha")}
    layer = "model.layers.2."
    assert alphas[layer + "input_layernorm"] == pytest.approx(0.8)
    assert alphas[layer + "post_attention_layernorm"] == pytest.approx(0.8)
    assert alphas[layer + "pre_feedforward_layernorm"] == pytest.approx(0.2)
    assert alphas[layer + "post_feedforward_layernorm"] == pytest.approx(0.2)
    assert alphas["model.norm"] == pytest.approx(0.1)
    assert alphas[layer + "self_attn.q_norm"] == pytest.approx(0.5)
    plain = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="dyt", dyt_alpha_init=0.3))
    assert [m.alpha.item() for m in plain.modules() if hasattr(m, "alpha")] == pytest.approx([0.3] * 9)


@pytest.mark.parametrize("field,value,word", [
    ("norm_scaling", "depth", "norm_position"), ("mix_ln_fraction", 1.5, "[0, 1]"), ("qk_norm", "both", "head"),
    ("norm_position", "sandwich", "peri"), ("deepnorm_alpha", -1.0, "> 0")])
def test_bad_plan_values_name_the_field(field, value, word):
    overrides = {field: value, **({"norm_position": "post"} if field == "norm_scaling" else {})}
    with pytest.raises(ValueError) as err:
        MiniMindConfig(**TINY, **overrides)
    assert field in str(err.value) and word in str(err.value)


# ---------------------------------------------------------------------------------------------------------
# Causality, caching, precision, persistence for every placement and norm type


def perturbed_future(x, t):
    changed = x.clone()
    changed[:, t:] = (changed[:, t:] + 7) % TINY["vocab_size"]
    return changed


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("norm_type", sorted(NORM_TYPES))
def test_causality_for_every_norm_type(norm_type, train):
    model = tiny_model(norm_type=norm_type, norm_position="peri").train(train)
    x = ids(batch=4, seq=16)
    with torch.no_grad():
        a, b = model(x).logits, model(perturbed_future(x, 9)).logits
    leak = (a[:, :9] - b[:, :9]).abs().max().item()
    if norm_type == "batchnorm" and train:
        # batch statistics mix every position: the test must see it, or it would see nothing at all
        assert leak > 1e-4
    else:
        assert leak == 0.0
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


def test_batchnorm_output_depends_on_the_rest_of_the_batch():
    model = tiny_model(norm_type="batchnorm").train()
    x = ids(batch=4)
    other = x.clone()
    other[1:] = (other[1:] + 3) % TINY["vocab_size"]
    with torch.no_grad():
        assert (model(x).logits[0] - model(other).logits[0]).abs().max() > 1e-4
        model.eval()  # running statistics: the first sequence no longer sees the others
        assert torch.equal(model(x).logits[0], model(other).logits[0])


@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_bf16_autocast_forward_backward(position):
    assert_bf16_autocast_trains(tiny_model(**placed(position, qk_norm="proj")).train())


@pytest.mark.parametrize("overrides", [{"norm_position": "peri", "qk_norm": "head"},
                                       {"norm_position": "mix", "norm_scaling": "depth", "norm_type": "layernorm"},
                                       {"norm_position": "deepnorm", "norm_type": "batchnorm"},
                                       placed("hybrid_star", sub_norm=True, embed_norm="norm", norm_gain="one_plus_w"),
                                       {"embed_norm": "scale", "norm_type": "layernorm", "norm_gain": "one_plus_w"}])
def test_save_load_round_trip(tmp_path, overrides):
    model = tiny_model(**overrides)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert {k: getattr(loaded.config, k) for k in overrides} == overrides
    with torch.no_grad():
        assert torch.equal(loaded(ids()).logits, model(ids()).logits)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_checkpoints_from_the_first_release_load_unchanged(name):
    """Saved by the model before the norm plan (pre/post x every norm type): same logits, same fresh init."""
    expected = torch.load(FIXTURES / name / "expected.pt")
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / name).eval()
    with torch.no_grad():
        assert_saved_logits(model(expected["input_ids"]).logits, expected["logits"])
        torch.manual_seed(1)
        fresh = MiniMindForCausalLM(model.config).eval()
        assert_saved_logits(fresh(expected["input_ids"]).logits, expected["fresh_logits"])


# ---------------------------------------------------------------------------------------------------------
# Export to the ecosystem


def load_converter():
    spec = importlib.util.spec_from_file_location("convert_to_hf", CONVERT)
    convert_to_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert_to_hf)
    return convert_to_hf


@pytest.mark.parametrize("overrides,cls", [
    ({}, LlamaForCausalLM), ({"norm_type": "rmsnorm_noparam"}, LlamaForCausalLM),
    ({"qk_norm": "head"}, Qwen3ForCausalLM), ({"norm_position": "reorder", "qk_norm": "proj"}, Olmo2ForCausalLM),
    ({"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale"}, Gemma2ForCausalLM),
    ({"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale", "qk_norm": "head"},
     Gemma3ForCausalLM),
    ({"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale", "logit_softcap": 0.05},
     Gemma2ForCausalLM)])
def test_export_gives_the_same_logits(tmp_path, overrides, cls):
    model = tiny_model(**overrides)
    model.save_pretrained(tmp_path / "src")
    assert load_converter().convert(tmp_path / "src", tmp_path / "dst") == cls.__name__
    # transformers 4.x reads theta from here (5.x from rope_parameters); without it 4.x would use 10000
    assert json.loads((tmp_path / "dst" / "config.json").read_text())["rope_theta"] == model.config.rope_theta
    exported = cls.from_pretrained(tmp_path / "dst").eval()
    with torch.no_grad():
        assert (exported(ids()).logits - model(ids()).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("overrides,word", [
    ({"norm_type": "layernorm"}, "norm_type"), ({"norm_type": "dyt"}, "norm_type"),
    ({"norm_type": "batchnorm"}, "norm_type"), ({"norm_type": "none"}, "norm_type"),
    ({"norm_position": "post"}, "norm_position"), ({"norm_position": "peri"}, "norm_position"),
    ({"norm_position": "deepnorm"}, "norm_position"), ({"norm_position": "mix"}, "norm_position"),
    ({"norm_position": "reorder"}, "norm_position"), ({"qk_norm": "proj"}, "qk_norm"),
    ({"norm_scaling": "depth"}, "norm_scaling"), ({"norm_type": "derf"}, "norm_type"),
    ({"norm_type": "seednorm"}, "norm_type"), ({"norm_position": "rezero"}, "rezero"),
    ({"logit_softcap": 15.0}, "logit_softcap")])
def test_export_refuses_what_no_family_computes(tmp_path, overrides, word):
    tiny_model(perturb=False, **overrides).save_pretrained(tmp_path / "src")
    with pytest.raises(UserError) as err:
        load_converter().convert(tmp_path / "src", tmp_path / "dst")
    assert str(err.value).startswith("cannot export") and word in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "dst").exists()


# ---------------------------------------------------------------------------------------------------------
# V-norm (QKV-norm) and single-scale RMSNorm


@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_v_norm_adds_one_norm_per_block(position):
    model = MiniMindForCausalLM(MiniMindConfig(**{**TINY, "num_hidden_layers": 8}, norm_position=position,
                                               qk_norm="head", v_norm="head"))
    assert count_norms(model) == docstring_counts()[position] + (0 if position in QKV_PLACEMENTS else 16 + 8)
    assert "model.layers.3.self_attn.v_norm.weight" in model.state_dict()


def test_qkv_norm_makes_logits_invariant_to_q_k_v_scale():
    def logits_after_scaling(model):
        with torch.no_grad():
            before = model(ids()).logits
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.weight.mul_(10)
            return before, model(ids()).logits

    # exact up to eps, and at init q, k, v have an RMS near 0.1, where eps=1e-5 would still show: make it tiny
    before, after = logits_after_scaling(tiny_model(qk_norm="head", v_norm="head", perturb=False,
                                                    rms_norm_eps=1e-12))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    before, after = logits_after_scaling(tiny_model(qk_norm="head", perturb=False, rms_norm_eps=1e-12))
    assert (after - before).abs().max() > 1e-3  # QK-norm alone: v still carries the scale


def test_v_norm_is_a_per_head_rms_of_v():
    model = tiny_model(v_norm="head")
    attn, x = model.model.layers[0].self_attn, torch.randn(2, 5, TINY["hidden_size"])
    seen = {}
    attn.o_proj.register_forward_hook(lambda m, inp, out: seen.setdefault("y", inp[0]))
    rope = model.model.rotary_emb(torch.arange(5)[None], x.dtype)
    with torch.no_grad():
        attn(x, rope, None, None)
        q, k, _ = attn.project_qk(x, rope)
        v = attn.v_proj(x).view(2, 5, 2, 16)
        v = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.v_norm.weight  # the formula
        rep = attn.n_heads // attn.n_kv_heads
        k, v = k.repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(16)
        scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, -1)
    torch.testing.assert_close(seen["y"], y, atol=1e-5, rtol=1e-5)


def test_ssnorm_has_one_gain_and_equals_rmsnorm_at_init():
    norm = mm.make_norm(MiniMindConfig(**TINY, norm_type="ssnorm"), "attn")
    assert sum(p.numel() for p in norm.parameters()) == 1
    x = torch.randn(3, 7, TINY["hidden_size"])
    plain = mm.make_norm(MiniMindConfig(**TINY, norm_type="rmsnorm"), "attn")
    assert torch.equal(norm(x), plain(x))
    with torch.no_grad():
        norm.weight.fill_(2.5)
    torch.testing.assert_close(norm(x), 2.5 * plain(x))


@pytest.mark.parametrize("overrides,word", [({"v_norm": "proj"}, "v_norm"),
                                            ({"v_norm": "head", "norm_type": "none"}, "v_norm")])
def test_bad_v_norm_names_the_field(overrides, word):
    with pytest.raises(ValueError, match=word):
        MiniMindConfig(**TINY, **overrides)


def test_export_refuses_v_norm():
    from model.hf_export import hf_family
    with pytest.raises(ValueError, match="v_norm"):
        hf_family(MiniMindConfig(**TINY, qk_norm="head", v_norm="head"))


@pytest.mark.parametrize("on", [False, True])
def test_norm_weight_decay_shrinks_gains_by_lr_times_decay(on):
    from trainer.optim import build_optimizer
    model = tiny_model(perturb=False)
    gain = model.model.layers[0].input_layernorm.weight
    optimizer = build_optimizer(model, lr=0.1, weight_decay=0.5, norm_weight_decay=on)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    expected = torch.full_like(gain, 1 - 0.1 * 0.5 if on else 1.0)
    torch.testing.assert_close(gain.detach(), expected)
