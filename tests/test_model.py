"""model/model_minimind.py: the config and its checks, the norms each placement builds, every placement and
attention option against its formula written out with plain tensor ops, the exact reductions between them, and
the forward's inputs and outputs (padding, the KV cache, labels, sampling)."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from model import NORM_POSITIONS, NORM_TYPES, MiniMindConfig, MiniMindForCausalLM, count_norms, model_minimind
from model.model_minimind import QKV_PLACEMENTS
from tests.tiny import TINY, ids, placed, tiny_model, with_weights_of


def test_default_is_minimind2_small():
    cfg = MiniMindConfig()
    model = MiniMindForCausalLM(cfg)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (6400, 512, 8)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (8, 2, 1408)
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1e6, 1e-5)
    assert sum(p.numel() for p in model.parameters()) == 25_829_888
    # the count, also from the file that declares the model
    assert count_norms(model) == model_minimind.count_norms(model) == 17
    assert model.lm_head.weight is model.model.embed_tokens.weight


# a bad value or pair of values -> the words its one-line error must contain (the fields, and what is
# allowed); test_args.py checks the whole message of a few more
BAD_CONFIGS = {
    "heads not dividing hidden": ({"num_attention_heads": 5}, ("num_attention_heads", "even head size")),
    "kv heads not dividing heads": ({"num_key_value_heads": 3}, ("num_key_value_heads", "multiple")),
    "unknown norm type": ({"norm_type": "groupnorm"}, ("norm_type", "rmsnorm")),
    "unknown placement": ({"norm_position": "sandwich"}, ("norm_position", "peri")),
    "mix fraction above 1": ({"mix_ln_fraction": 1.5}, ("mix_ln_fraction", "[0, 1]")),
    "negative deepnorm alpha": ({"deepnorm_alpha": -1.0}, ("deepnorm_alpha", "> 0")),
    "unknown qk_norm": ({"qk_norm": "both"}, ("qk_norm", "head")),
    "hybrid without qk_norm": ({"norm_position": "hybrid", "qk_norm": "none"}, ("norm_position", "qk_norm")),
    "hybrid_star without v_norm": ({**placed("hybrid_star"), "v_norm": "none"}, ("norm_position", "v_norm")),
    "hybrid with proj qk_norm": ({**placed("hybrid"), "qk_norm": "proj"}, ("qk_norm",)),
    "v_norm without norms": ({"v_norm": "head", "norm_type": "none"}, ("v_norm",)),
    "sub_norm not a bool": ({"sub_norm": "yes"}, ("sub_norm",)),
    "sub_norm without norms": ({"sub_norm": True, "norm_type": "none"}, ("sub_norm",)),
    "embed_norm without norms": ({"embed_norm": "norm", "norm_type": "none"}, ("embed_norm",)),
    "one_plus_w without a gain": ({"norm_gain": "one_plus_w", "norm_type": "rmsnorm_noparam"},
                                  ("norm_gain", "norm_type")),
    "infinite softcap": ({"logit_softcap": math.inf}, ("logit_softcap",)),
}


@pytest.mark.parametrize("overrides,words", BAD_CONFIGS.values(), ids=list(BAD_CONFIGS))
def test_a_bad_config_is_one_line_naming_the_fields_and_what_is_allowed(overrides, words):
    with pytest.raises(ValueError) as err:
        MiniMindConfig(**{**TINY, **overrides})
    assert all(word in str(err.value) for word in words) and "\n" not in str(err.value), str(err.value)


# ---------------------------------------------------------------------------------------------------------
# Which norms each placement builds, under the names of the Hugging Face family that uses it (4 blocks)

PRE = {"input_layernorm", "post_attention_layernorm"}
POST = {"post_attention_layernorm", "post_feedforward_layernorm"}
QKV = {"self_attn.q_norm", "self_attn.k_norm", "self_attn.v_norm"}
HYBRID = {"post_attention_layernorm", *QKV}  # no MLP norm
BLOCK_NORMS = {"pre": [PRE] * 4, "post": [POST] * 4, "peri": [PRE | POST | {"pre_feedforward_layernorm"}] * 4,
               "reorder": [POST] * 4, "deepnorm": [POST] * 4, "mix": [POST] + [PRE] * 3,  # 1 Post block of 4
               "hybrid": [HYBRID] * 4, "hybrid_star": [PRE | HYBRID] + [HYBRID] * 3, "rezero": [set()] * 4}
WITHOUT_FINAL_NORM = ("post", "deepnorm", "rezero")
# switches -> the norms they add to every block; the embedding scale and (1 + w) gains add none
SWITCH_NORMS = [({}, set()), ({"qk_norm": "head"}, {"self_attn.q_norm", "self_attn.k_norm"}),
                ({"qk_norm": "proj"}, {"self_attn.q_norm", "self_attn.k_norm"}),
                ({"qk_norm": "head", "v_norm": "head"}, QKV), ({"embed_norm": "norm"}, set()),
                ({"sub_norm": True}, {"self_attn.attn_sub_norm", "mlp.ffn_sub_norm"}),
                ({"embed_norm": "scale", "norm_gain": "one_plus_w"}, set())]


@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_the_norms_of_every_placement_by_name_and_count(position):
    for switches, added in SWITCH_NORMS:
        model = tiny_model(perturb=False, **placed(position, **switches))
        expected = {f"model.layers.{i}.{name}" for i, names in enumerate(BLOCK_NORMS[position])
                    for name in names | added}
        expected |= set() if position in WITHOUT_FINAL_NORM else {"model.norm"}
        expected |= {"model.word_embeddings_layernorm"} if switches.get("embed_norm") == "norm" else set()
        norms = {k.removesuffix(".weight") for k in model.state_dict() if k.endswith("norm.weight")}
        assert norms == expected and count_norms(model) == len(expected), switches
    if position not in QKV_PLACEMENTS:  # they require norms on q, k and v
        assert count_norms(tiny_model(perturb=False, norm_position=position, norm_type="none")) == 0


@pytest.mark.parametrize("norm_type", sorted(set(NORM_TYPES) - {"none"}))
def test_every_norm_type_fills_every_slot_and_counts_as_a_norm(norm_type):
    """Norms are counted as modules, so a parameter-free one counts too."""
    fields = placed("hybrid_star", sub_norm=True, embed_norm="norm")
    assert count_norms(tiny_model(perturb=False, norm_type=norm_type, **fields)) == \
        count_norms(tiny_model(perturb=False, **fields))


# ---------------------------------------------------------------------------------------------------------
# Every placement and option against an independent reference forward (plain tensor ops on the weights)


def ref_norm(h, w, name, cfg):
    """RMSNorm with the gain stored under name: w as stored, or 1 + w for norm_gain='one_plus_w'."""
    gain = w[name + ".weight"]
    gain = 1 + gain if cfg.norm_gain == "one_plus_w" else gain
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * gain


def ref_rope(x, theta=1e6):
    """Rotate-half RoPE on [batch, heads, seq, dim], positions 0..seq-1."""
    dim, seq = x.shape[-1], x.shape[-2]
    angles = torch.arange(seq)[:, None].float() / theta ** (torch.arange(0, dim, 2).float() / dim)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], -1) * sin


def ref_attention(x, w, prefix, cfg):
    b, t, _ = x.shape
    H, K, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, k, v = (x @ w[f"{prefix}.{name}_proj.weight"].T for name in "qkv")
    if cfg.qk_norm == "proj":
        q, k = ref_norm(q, w, f"{prefix}.q_norm", cfg), ref_norm(k, w, f"{prefix}.k_norm", cfg)
    q, k, v = q.view(b, t, H, D), k.view(b, t, K, D), v.view(b, t, K, D)
    if cfg.qk_norm == "head":
        q, k = ref_norm(q, w, f"{prefix}.q_norm", cfg), ref_norm(k, w, f"{prefix}.k_norm", cfg)
    if cfg.v_norm == "head":
        v = ref_norm(v, w, f"{prefix}.v_norm", cfg)
    q, k = ref_rope(q.transpose(1, 2)), ref_rope(k.transpose(1, 2))
    k, v = k.repeat_interleave(H // K, 1), v.transpose(1, 2).repeat_interleave(H // K, 1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(torch.ones(t, t).triu(1).bool(), -math.inf)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, H * D)
    if cfg.sub_norm:  # Sub-LN: the concatenated heads normalized before o_proj
        out = ref_norm(out, w, f"{prefix}.attn_sub_norm", cfg)
    return out @ w[f"{prefix}.o_proj.weight"].T


def ref_mlp(x, w, prefix, cfg):
    h = F.silu(x @ w[f"{prefix}.gate_proj.weight"].T) * (x @ w[f"{prefix}.up_proj.weight"].T)
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
    if cfg.norm_position not in WITHOUT_FINAL_NORM:
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
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_logits_match_the_reference_forward(overrides):
    model = tiny_model(**overrides)
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, ref_forward(model, ids()), atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# Reductions: a placement or option collapses to another exactly where its formula says it must


def logits(model, **kw):
    with torch.no_grad():
        return model(ids(), **kw).logits


def test_mix_with_fraction_zero_is_pre_and_with_fraction_one_is_post_plus_final_norm():
    pre = tiny_model()
    assert torch.equal(logits(with_weights_of(pre, norm_position="mix", mix_ln_fraction=0.0)), logits(pre))
    mix = tiny_model(norm_position="mix", mix_ln_fraction=1.0)
    post = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_position="post")).eval()
    post.load_state_dict(mix.state_dict(), strict=False)  # all but the final norm
    with torch.no_grad():
        h = post.model(ids()).last_hidden_state
        torch.testing.assert_close(mix.model(ids()).last_hidden_state, mix.model.norm(h))


def test_deepnorm_with_unit_alpha_and_beta_is_post_and_its_beta_scales_the_init_of_v_o_and_mlp_only():
    """(Its skip scale, alpha = (2L)^(1/4), is in the reference forward.)"""
    post = tiny_model(norm_position="post")
    unit = {"norm_position": "deepnorm", "deepnorm_alpha": 1.0, "deepnorm_beta": 1.0}
    assert torch.equal(logits(with_weights_of(post, **unit)), logits(post))
    L = 8  # the fresh weights at one seed: post's, and deepnorm's with unit beta and with its default
    post_init, unit_init, deep_init = [
        tiny_model(seed=3, perturb=False, num_hidden_layers=L, **fields).state_dict()
        for fields in ({"norm_position": "post"}, unit, {"norm_position": "deepnorm"})]
    for key in post_init:
        assert torch.equal(unit_init[key], post_init[key]), key
        if any(s in key for s in ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")):
            torch.testing.assert_close(deep_init[key], post_init[key] * (8 * L) ** -0.25)  # the same, x beta
        else:
            assert torch.equal(deep_init[key], post_init[key]), key


def test_depth_scaling_leaves_block_one_as_pre_and_scales_later_blocks():
    pre = tiny_model()
    scaled = with_weights_of(pre, norm_scaling="depth")
    with torch.no_grad():
        a = pre.model(ids(), output_hidden_states=True).hidden_states
        b = scaled.model(ids(), output_hidden_states=True).hidden_states
    assert torch.equal(a[1], b[1])  # the output of block 1 (scale 1/sqrt(1))
    assert not torch.allclose(a[2], b[2])


def test_hybrid_star_with_one_layer_is_pre_with_qkv_norm():
    star = tiny_model(num_hidden_layers=1, **placed("hybrid_star"))
    pre = with_weights_of(star, num_hidden_layers=1, qk_norm="head", v_norm="head")  # the same modules
    assert torch.equal(logits(pre), logits(star))


@pytest.mark.parametrize("norm_type", [n for n, kind in NORM_TYPES.items() if kind.gain])
def test_one_plus_w_at_zero_is_bit_identical_to_unit_gains(norm_type):
    """Same seed, so the same weight draws; w = 0 under (1 + w) against gains of 1: the same fp32 forward and
    the same gradients, bit for bit, in every slot (block, QK-, sub-, embedding and final norms)."""
    def run(norm_gain):
        model = tiny_model(perturb=False, norm_type=norm_type, norm_gain=norm_gain, sub_norm=True,
                           embed_norm="norm", **placed("peri", qk_norm="head", v_norm="head")).train()
        x = ids(seq=16)
        out = model(x[:, :-1], shift_labels=x[:, 1:])
        out.loss.backward()
        return model, out.logits

    (plain, plain_logits), (centred, centred_logits) = run("w"), run("one_plus_w")
    assert torch.equal(plain_logits, centred_logits)
    gains = [name for name, _ in centred.named_parameters() if name.endswith("norm.weight")]
    assert gains and all(torch.all(centred.get_parameter(n) == 0) and torch.all(plain.get_parameter(n) == 1)
                         for n in gains)
    for (name, p), q in zip(plain.named_parameters(), centred.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("centred", [True, False])
def test_pre_layernorm_equals_pre_rmsnorm_on_a_zero_mean_stream(centred):
    """Jiang et al. (2023): if all written into the residual stream (embeddings, o_proj, down_proj) has zero
    mean over the hidden dimension, so has the stream, LayerNorm without bias is RMSNorm, and Pre-LN and
    Pre-RMSNorm give the same logits (fp64: 8e-8 apart). Without the centring they do not (0.16 apart)."""
    rms = tiny_model(seed=4).double()
    if centred:
        with torch.no_grad():
            rms.model.embed_tokens.weight.sub_(rms.model.embed_tokens.weight.mean(-1, keepdim=True))
            for layer in rms.model.layers:
                for writer in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    writer.weight.sub_(writer.weight.mean(0, keepdim=True))  # each column sums to 0
    ln = MiniMindForCausalLM(MiniMindConfig(**TINY, norm_type="layernorm")).double().eval()
    missing, unexpected = ln.load_state_dict(rms.state_dict(), strict=False)
    assert not unexpected and missing and all(k.endswith("norm.bias") for k in missing)
    with torch.no_grad():
        for name in missing:
            ln.get_parameter(name).zero_()
    gap = (logits(rms) - logits(ln)).abs().max().item()
    # RMSNorm takes its statistics in float32 even for fp64 input: equal up to that
    assert gap < 1e-6 if centred else gap > 1e-3


# ---------------------------------------------------------------------------------------------------------
# What a norm or an option makes the model invariant to, and the options that are not norms


@pytest.mark.parametrize("fields,control,projections", [
    ({"qk_norm": "head"}, {}, ["self_attn.q_proj"]),
    ({"qk_norm": "proj"}, {}, ["self_attn.q_proj"]),
    # q, k, v all normalized: exact up to eps, and at init q, k, v have an RMS near 0.1, where eps = 1e-5
    # would still show, so eps is made tiny; with QK-norm alone v still carries the scale
    ({"qk_norm": "head", "v_norm": "head"}, {"qk_norm": "head"},
     ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
    # the sub-norms normalize the heads' output and the SwiGLU product, which are linear in v_proj and up_proj
    ({"sub_norm": True}, {}, ["self_attn.v_proj", "mlp.up_proj"]),
], ids=["qk_head", "qk_proj", "qkv", "sub_norm"])
def test_a_norm_makes_the_logits_invariant_to_the_scale_of_what_it_normalizes(fields, control, projections):
    for config, invariant in ((fields, True), (control, False)):
        model = tiny_model(perturb=False, rms_norm_eps=1e-12, **config)
        before = logits(model)
        with torch.no_grad():
            for layer in model.model.layers:
                for name in projections:
                    layer.get_submodule(name).weight.mul_(10)
        gap = (logits(model) - before).abs().max()
        assert gap < 1e-4 if invariant else gap > 1e-3, config


def test_rezero_is_the_identity_at_init_and_its_scales_learn():
    """x + a * F(x) with a = 0: every block hands on its input unchanged, there is no norm, the logits are the
    embedding times lm_head; the scales get gradients, the sublayers' weights none until they move."""
    model = tiny_model(perturb=False, norm_position="rezero").train()
    x = ids(seq=12)
    out = model(x[:, :-1], shift_labels=x[:, 1:], output_hidden_states=True)
    embedded = model.model.embed_tokens(x[:, :-1])
    assert all(torch.equal(h, embedded) for h in out.hidden_states)
    torch.testing.assert_close(out.logits, embedded @ model.lm_head.weight.T)
    out.loss.backward()
    for layer in model.model.layers:
        assert layer.attn_residual_scale.grad.abs() > 0 and layer.mlp_residual_scale.grad.abs() > 0
        assert torch.all(layer.self_attn.q_proj.weight.grad == 0)


def test_logit_softcap_bounds_the_logits_in_float32_and_the_loss_is_taken_on_them():
    """logits = C * tanh(z / C), in float32, with z what the model computes without the cap."""
    capped = tiny_model(logit_softcap=0.5)
    plain = with_weights_of(capped)
    with torch.no_grad():
        for model in (capped, plain):
            model.lm_head.weight.mul_(100)  # logits far beyond the cap (lm_head is tied: the embedding too)
    z, capped_logits = logits(plain), logits(capped)
    assert z.abs().max() > 5 and torch.equal(capped_logits, 0.5 * torch.tanh(z / 0.5))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert capped(ids()).logits.dtype == torch.float32
    x = ids()
    expected = F.cross_entropy(capped_logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    torch.testing.assert_close(capped(x[:, :-1], shift_labels=x[:, 1:]).loss, expected)


# ---------------------------------------------------------------------------------------------------------
# The forward's inputs and outputs: padding, the KV cache, labels, dtypes, generation


def test_padded_batch_matches_unpadded():
    model = tiny_model()
    x = ids(batch=1, seq=8)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(padded, attention_mask=mask, position_ids=pos).logits[:, 3:]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, model(x).logits.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": "head"}, {"qk_norm": "proj", "v_norm": "head"}],
                         ids=["plain", "qk_head", "qk_proj+v_head"])
def test_kv_cache_decoding_of_a_left_padded_batch_matches_the_full_forward(overrides):
    """Token by token on a left-padded batch, and a multi-token chunk on top of a cache (which needs the
    explicit, offset causal mask) with and without padding. Unpadded decoding: test_variants.py."""
    model = tiny_model(**overrides)
    x = ids(seq=10)
    padding = torch.ones_like(x)
    padding[1, :3] = 0
    with torch.no_grad():
        full = model(x, attention_mask=padding).logits
        out = model(x[:, :6], attention_mask=padding[:, :6], use_cache=True)
        steps = [out.logits]
        for t in range(6, 10):
            out = model(x[:, t:t + 1], attention_mask=padding[:, :t + 1], cache=out.cache, use_cache=True)
            steps.append(out.logits)
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
        for mask in (None, padding):
            chunked = model(x[:, :7], attention_mask=None if mask is None else mask[:, :7], use_cache=True)
            rest = model(x[:, 7:], attention_mask=mask, cache=chunked.cache, use_cache=True)
            expected = full if mask is padding else model(x).logits
            torch.testing.assert_close(rest.logits, expected[:, 7:], atol=1e-5, rtol=1e-5)
        generated = model.generate(x, attention_mask=padding, max_new_tokens=4, do_sample=False,
                                   pad_token_id=0)
    assert generated.shape == (2, 14)


def test_the_caches_old_name_is_taken_as_cache():
    """A tutorial written for transformers < 5.24 passes past_key_values=; **kwargs would swallow it and the
    model would see the new token alone. Taken as Llama takes it (warning until transformers 5.40)."""
    model = tiny_model()
    x = ids(seq=6)
    with torch.no_grad():
        prefix = model(x[:, :5], use_cache=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            last = model(x[:, 5:], past_key_values=prefix.cache, use_cache=True).logits
        torch.testing.assert_close(last, model(x).logits[:, 5:], atol=1e-5, rtol=1e-5)


def test_initial_loss_is_ln_vocab():
    model = tiny_model(perturb=False, vocab_size=6400)
    x = torch.randint(0, 6400, (4, 64))
    with torch.no_grad():
        assert abs(model(x, labels=x).loss.item() - math.log(6400)) < 0.1


def test_shift_labels_equals_hf_labels():
    model = tiny_model()
    w = ids(seq=11)
    with torch.no_grad():
        ref = F.cross_entropy(model(w).logits[:, :-1].reshape(-1, TINY["vocab_size"]), w[:, 1:].reshape(-1))
        torch.testing.assert_close(model(w, labels=w).loss, ref)
        torch.testing.assert_close(model(w[:, :-1], shift_labels=w[:, 1:]).loss, ref)


def test_rope_keeps_queries_and_keys_in_the_autocast_dtype():
    """Under bf16 autocast the projections give bf16 q and k; RoPE's tables follow them instead of promoting
    them to fp32 (which attention would cast back). Without autocast everything stays fp32."""
    model = tiny_model()
    seen = []
    for layer in model.model.layers:
        project = layer.self_attn.project_qk
        layer.self_attn.project_qk = lambda *a, _p=project: seen.append(_p(*a)) or seen[-1]
    for autocast, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        seen.clear()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            logits(model)
        assert {t.dtype for qk in seen for t in qk[:2]} == {dtype}
