"""Attention output gates (attn_gate) and learnable attention sinks (attn_sinks), checked against their formulas
written out with plain tensor ops, their exact reductions, the KV cache, old checkpoints and the diagnostics that
measure what they aim at (attention mass on token 0 and on the sinks, excess kurtosis of the stream)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from model import MiniMindConfig, MiniMindForCausalLM, count_norms, norm_variant
from model.model_minimind import CACHE_FIELD, Attention
from tests.tiny import FIXTURES, TINY, assert_bf16_autocast_trains, assert_saved_logits, ids, tiny_model
from trainer.diagnostics import attention_sink_mass, excess_kurtosis, layer_stats

H, KV, D = 4, 2, 16
LAYERS = TINY["num_hidden_layers"]
GATE_WIDTH = {"headwise": 1, "elementwise": D}


# ---------------------------------------------------------------------------------------------------------
# The formulas, written out: Pre-Norm RMSNorm blocks whose attention has an output gate and/or sinks


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x):
    seq = x.shape[-2]
    angles = torch.arange(seq)[:, None].float() / 1e6 ** (torch.arange(0, D, 2).float() / D)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin


def ref_attention(x, w, p, gate, sinks, qk_norm):
    """Gate (Qiu et al. 2025, Qwen3-Next's layout): q_proj's output holds per head the query, then g gate logits
    (g = head_dim elementwise, 1 headwise); y_h <- y_h * sigmoid(gate_h). Sinks (GPT-OSS): softmax over the row's
    logits and the head's sink logit, then the sink's column is dropped."""
    b, t, _ = x.shape
    g = GATE_WIDTH.get(gate, 0)
    qg = (x @ w[p + "q_proj.weight"].T).view(b, t, H, D + g)
    q, gate_logits = qg[..., :D].reshape(b, t, H * D), qg[..., D:]
    k, v = x @ w[p + "k_proj.weight"].T, x @ w[p + "v_proj.weight"].T
    if qk_norm == "proj":
        q, k = rmsnorm(q, w[p + "q_norm.weight"]), rmsnorm(k, w[p + "k_norm.weight"])
    q, k = rope(q.view(b, t, H, D).transpose(1, 2)), rope(k.view(b, t, KV, D).transpose(1, 2))
    k, v = k.repeat_interleave(H // KV, 1), v.view(b, t, KV, D).transpose(1, 2).repeat_interleave(H // KV, 1)
    logits = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(torch.ones(t, t).triu(1).bool(), -math.inf)
    if sinks:
        logits = torch.cat([logits, w[p + "sinks"].view(1, H, 1, 1).expand(b, H, t, 1)], -1)
    probs = logits.softmax(-1)[..., :t]
    y = (probs @ v).transpose(1, 2)  # [b, t, H, D]
    if g:
        y = y * torch.sigmoid(gate_logits)
    return y.reshape(b, t, H * D) @ w[p + "o_proj.weight"].T


def ref_forward(model, input_ids):
    cfg, w = model.config, model.state_dict()
    x = w["model.embed_tokens.weight"][input_ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = x + ref_attention(rmsnorm(x, w[p + "input_layernorm.weight"]), w, p + "self_attn.", cfg.attn_gate,
                              cfg.attn_sinks, cfg.qk_norm)
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    return rmsnorm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("qk_norm", ["none", "proj"])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("gate", ["none", "headwise", "elementwise"])
def test_logits_match_the_formulas(gate, sinks, qk_norm):
    model = tiny_model(attn_gate=gate, attn_sinks=sinks, qk_norm=qk_norm)
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, ref_forward(model, ids()), atol=2e-5, rtol=1e-4)


def test_gate_and_sink_shapes_and_names():
    w = {g: tiny_model(attn_gate=g, attn_sinks=True).state_dict() for g in ("none", "headwise", "elementwise")}
    assert [w[g]["model.layers.0.self_attn.q_proj.weight"].shape[0] for g in w] == [H * D, H * (D + 1), 2 * H * D]
    assert w["none"]["model.layers.2.self_attn.sinks"].shape == (H,)
    plain = set(MiniMindForCausalLM(MiniMindConfig(**TINY)).state_dict())
    assert set(w["elementwise"]) - plain == {f"model.layers.{i}.self_attn.sinks" for i in range(LAYERS)}


# ---------------------------------------------------------------------------------------------------------
# Exact reductions


def copy_into(source, **overrides):
    """A model of another config holding source's weights (strict: the same names and shapes)."""
    target = MiniMindForCausalLM(MiniMindConfig(**{**TINY, **overrides})).eval()
    target.load_state_dict(source.state_dict())
    return target


def left_padded():
    x = ids(seq=10)
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    return x, mask


def test_sinks_at_minus_infinity_are_no_sinks_exactly():
    model = tiny_model(attn_sinks=True, attn_gate="headwise")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-math.inf)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("sinks")}
    plain = MiniMindForCausalLM(MiniMindConfig(**TINY, attn_gate="headwise")).eval()
    plain.load_state_dict(state)
    x, mask = left_padded()
    with torch.no_grad():
        assert torch.equal(model(x).logits, plain(x).logits)
        assert torch.equal(model(x, attention_mask=mask).logits, plain(x, attention_mask=mask).logits)
        model.model.layers[0].self_attn.sinks.fill_(0.0)  # the check has teeth: a finite sink changes the output
        assert not torch.allclose(model(x).logits, plain(x).logits)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_a_zero_gate_projection_halves_the_attention_output_exactly(gate):
    torch.manual_seed(0)
    plain = Attention(MiniMindConfig(**TINY), 0)
    gated = Attention(MiniMindConfig(**TINY, attn_gate=gate), 0)
    with torch.no_grad():
        for name in ("k_proj", "v_proj", "o_proj"):
            getattr(gated, name).weight.copy_(getattr(plain, name).weight)
        q = gated.q_proj.weight.view(H, D + GATE_WIDTH[gate], -1)  # per head: query rows, then gate rows
        q[:, :D] = plain.q_proj.weight.view(H, D, -1)
        q[:, D:] = 0
        x = torch.randn(2, 9, TINY["hidden_size"])
        rope_tables = (torch.ones(1, 9, D), torch.zeros(1, 9, D))  # positions need not matter here
        assert torch.equal(gated(x, rope_tables, None, None), 0.5 * plain(x, rope_tables, None, None))


# ---------------------------------------------------------------------------------------------------------
# Generation: the KV cache (with left padding) gives what the full forward gives


@pytest.mark.parametrize("overrides", [{"attn_sinks": True}, {"attn_gate": "elementwise"},
                                       {"attn_gate": "headwise", "attn_sinks": True, "qk_norm": "head"}])
def test_kv_cache_matches_full_forward(overrides):
    model = tiny_model(**overrides)
    x, mask = left_padded()
    with torch.no_grad():
        for m in (None, mask):
            full = model(x, attention_mask=m).logits
            out = model(x[:, :6], attention_mask=None if m is None else m[:, :6], use_cache=True)
            steps = [out.logits]
            for t in range(6, 10):
                out = model(x[:, t:t + 1], attention_mask=None if m is None else m[:, :t + 1],
                            past_key_values=getattr(out, CACHE_FIELD), use_cache=True)
                steps.append(out.logits)
            torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
        generated = model.generate(x, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert generated.shape == (2, 14)


def test_sinks_learn_and_gates_and_sinks_are_not_norms():
    model = tiny_model(attn_sinks=True, attn_gate="elementwise").train()
    x = ids()
    model(x[:, :-1], shift_labels=x[:, 1:]).loss.backward()
    assert all(layer.self_attn.sinks.grad.abs().min() > 0 for layer in model.model.layers)
    plain = MiniMindForCausalLM(MiniMindConfig(**TINY))
    assert count_norms(model) == count_norms(plain) == 2 * LAYERS + 1  # two per block, the final one
    assert norm_variant(model.config) == "pre+gate+sinks-rmsnorm"
    assert norm_variant(MiniMindConfig(**TINY, attn_gate="headwise")) == "pre+gate_head-rmsnorm"


def test_bf16_autocast_forward_backward_with_gates_and_sinks():
    """Under autocast the sinks' float mask takes the queries' dtype (SDPA requires it); the sinks still learn."""
    model = tiny_model(attn_sinks=True, attn_gate="elementwise").train()
    assert_bf16_autocast_trains(model)
    assert all(layer.self_attn.sinks.grad.abs().max() > 0 for layer in model.model.layers)


@pytest.mark.parametrize("overrides,word", [({"attn_gate": "channel"}, "attn_gate"),
                                            ({"attn_sinks": "yes"}, "attn_sinks")])
def test_bad_values_name_the_field(overrides, word):
    with pytest.raises(ValueError, match=word):
        MiniMindConfig(**TINY, **overrides)


def test_export_refuses_gates_and_sinks():
    from model.hf_export import hf_family
    for overrides in ({"attn_gate": "elementwise"}, {"attn_sinks": True}):
        with pytest.raises(ValueError, match="attn_gate and attn_sinks"):
            hf_family(MiniMindConfig(**TINY, **overrides))


# ---------------------------------------------------------------------------------------------------------
# Old checkpoints: a config without the new fields means no gate and no sinks, and the same numbers


def test_old_checkpoints_load_without_gates_or_sinks_unchanged():
    folder = FIXTURES / "pre-rmsnorm"
    saved = json.loads((folder / "config.json").read_text())
    assert "attn_gate" not in saved and "attn_sinks" not in saved  # written before these fields existed
    expected = torch.load(folder / "expected.pt")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert (model.config.attn_gate, model.config.attn_sinks) == ("none", False)
    assert not any(name.endswith("sinks") for name in model.state_dict())
    with torch.no_grad():
        assert_saved_logits(model(expected["input_ids"]).logits, expected["logits"])


def test_save_load_round_trip(tmp_path):
    model = tiny_model(attn_gate="elementwise", attn_sinks=True)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids()).logits, model(ids()).logits)


# ---------------------------------------------------------------------------------------------------------
# Diagnostics: attention mass on token 0 and on the sinks, excess kurtosis


def test_sink_mass_and_kurtosis_on_hand_built_cases():
    # q = 0: every logit is 0, so query t (0-based) spreads evenly over its t + 1 keys and the sink
    seq = 5
    q, k = torch.zeros(2, H, seq, D), torch.randn(2, KV, seq, D)
    first, sink = attention_sink_mass(q, k, torch.zeros(H)).tolist()
    expected = sum(1 / (t + 2) for t in range(1, seq)) / (seq - 1)
    assert first == pytest.approx(expected) and sink == pytest.approx(expected)
    first, sink = attention_sink_mass(q, k).tolist()  # no sinks: 1 / (t + 1), nothing on a sink
    assert first == pytest.approx(sum(1 / (t + 1) for t in range(1, seq)) / (seq - 1)) and sink == 0
    assert excess_kurtosis(torch.tensor([1.0, -1.0] * 50)).item() == pytest.approx(-2.0)  # two points: 1 - 3
    spike = torch.zeros(1000)
    spike[0] = 1.0  # one outlier among zeros: kurtosis ~ n
    assert excess_kurtosis(spike).item() == pytest.approx(1000 - 2 - 3 + 1 / 999, rel=1e-3)


def test_layer_stats_match_a_direct_computation_with_gates_and_sinks():
    model = tiny_model(attn_sinks=True, attn_gate="elementwise")
    x = ids()
    stats = layer_stats(model, x)
    w = model.state_dict()
    with torch.no_grad():
        hidden = model(x, output_hidden_states=True).hidden_states
        for i in range(LAYERS):
            p = f"model.layers.{i}."
            h = rmsnorm(hidden[i], w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(2, 12, H, 2 * D)[..., :D]  # the gate half dropped
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(2, 12, KV, D)
            q, k = rope(q.transpose(1, 2)), rope(k.transpose(1, 2)).repeat_interleave(H // KV, 1)
            logits = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(torch.ones(12, 12).triu(1).bool(),
                                                                           -math.inf)
            sinks = w[p + "self_attn.sinks"].view(1, H, 1, 1).expand(2, H, 12, 1)
            probs = torch.cat([logits, sinks], -1).softmax(-1)[:, :, 1:]
            assert stats["attn_first_token"][i] == pytest.approx(probs[..., 0].mean().item(), rel=1e-5)
            assert stats["attn_sink_share"][i] == pytest.approx(probs[..., -1].mean().item(), rel=1e-5)
            assert stats["max_attn_logit"][i] == pytest.approx(logits.max().item(), rel=1e-5)
            s = hidden[i].flatten().double()
            kurtosis = ((s - s.mean()) ** 4).mean() / ((s - s.mean()) ** 2).mean() ** 2 - 3
            assert stats["excess_kurtosis"][i] == pytest.approx(kurtosis.item(), rel=1e-5, abs=1e-6)
    assert "attn_sink_share" not in layer_stats(tiny_model(), x)  # only where sinks exist


def test_trainer_flags_build_gates_and_sinks_and_log_the_sink_share(tmp_path, tiny_flags, monkeypatch):
    from trainer.args import parse_args
    from trainer.tracking import read_metrics
    from trainer.train_pretrain import train

    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    args = parse_args([*tiny_flags, "--num_hidden_layers", "2", "--max_seq_len", "16", "--batch_size", "2",
                       "--eval_steps", "1", "--max_steps", "2", "--log_interval", "2", "--eval_interval", "2",
                       "--attn_gate", "headwise", "--attn_sinks", "--out_dir", str(tmp_path / "run")])
    assert not train(args)["diverged"]
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["variant"] == "pre+gate_head+sinks-rmsnorm"
    (record,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    for key in ("attn_first_token", "attn_sink_share", "excess_kurtosis"):
        assert len(record[key]) == 2 and all(math.isfinite(v) for v in record[key]), key
    assert all(0 < a + s <= 1 for a, s in zip(record["attn_first_token"], record["attn_sink_share"], strict=True))
