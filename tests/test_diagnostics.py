"""The per-layer diagnostics on hand-built cases, the hooks that gather them from a real model, and the trainer's
records of them."""

import math
from argparse import Namespace

import pytest
import torch
from torch._dynamo.utils import counters

from model import NORM_POSITIONS, QK_NORMS, MiniMindConfig, MiniMindForCausalLM
from model.model_minimind import QKV_PLACEMENTS, Attention, RotaryEmbedding, apply_rotary
from trainer.args import parse_args
from trainer.diagnostics import block_cosine, layer_stats, massive_activation_ratio, max_attention_logit, rms
from trainer.tracking import read_metrics
from trainer.train_pretrain import train


def test_cosine_of_identical_orthogonal_and_opposite_streams():
    x = torch.randn(2, 5, 16)
    assert block_cosine(x, x).item() == pytest.approx(1.0)
    assert block_cosine(x, 3 * x).item() == pytest.approx(1.0)  # a block that only rescales does not turn the stream
    assert block_cosine(x, -x).item() == pytest.approx(-1.0)
    a, b = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    a[..., 0], b[0, 0, 1], b[0, 1, 0] = 1.0, 1.0, 1.0  # token 0 orthogonal (0), token 1 identical (1)
    assert block_cosine(a, b).item() == pytest.approx(0.5)


def test_massive_activation_ratio_finds_one_outlier():
    x = torch.ones(2, 8, 32)
    assert massive_activation_ratio(x).item() == pytest.approx(1.0)
    x[1, 3, 7] = -1000.0  # sign does not matter: it is a magnitude
    assert massive_activation_ratio(x).item() == pytest.approx(1000.0)
    assert rms(torch.full((3, 4), -2.0)).item() == pytest.approx(2.0)


def test_max_attention_logit_counts_only_causal_pairs_and_groups_heads():
    # 1 sequence, 2 query heads sharing 1 key head, 3 positions, head_dim 4
    q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 1, 3, 4)
    k[0, 0, 2, 0] = 10.0  # only the last key is large
    q[0, 0, 0, 0] = 50.0  # head 0 asks for it from position 0: in the future, must not count
    q[0, 1, 2, 0] = 3.0  # head 1 asks for it from position 2: allowed, logit 3 * 10 / sqrt(4)
    assert max_attention_logit(q, k).item() == pytest.approx(15.0)
    q[0, 1, 2, 0] = -3.0  # every allowed logit is now <= 0; the diagonal-and-below zeros win
    assert max_attention_logit(q, k).item() == pytest.approx(0.0)


def test_max_attention_logit_of_an_attention_layer_with_known_weights():
    """hidden 2, one head of dim 2: W_q reads the first feature, W_k the second. RoPE at theta^0 = 1 rotates a
    position-p vector by p radians, so q_i . k_j = x_i[0] * x_j[1] * cos(i - j)."""
    config = MiniMindConfig(vocab_size=8, hidden_size=2, num_hidden_layers=1, num_attention_heads=1,
                            num_key_value_heads=1)
    attention = Attention(config, 0)
    with torch.no_grad():
        attention.q_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
        attention.k_proj.weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    x = torch.tensor([[[10.0, 0.0], [2.0, 3.0], [1.0, 5.0]]])
    rope = RotaryEmbedding(config)(torch.arange(3)[None], torch.float32)
    logit = [[x[0, i, 0].item() * x[0, j, 1].item() * math.cos(i - j) / math.sqrt(2) for j in range(3)] for i in range(3)]
    expected = max(logit[i][j] for i in range(3) for j in range(i + 1))
    assert max(max(row) for row in logit) > expected + 1  # the largest product pairs query 0 with key 1, a future key
    assert max_attention_logit(*attention.project_qk(x, rope)[:2]).item() == pytest.approx(expected)
    with torch.no_grad():
        attention.k_proj.weight.mul_(10)  # no QK-norm: logits scale with W_k
    assert max_attention_logit(*attention.project_qk(x, rope)[:2]).item() == pytest.approx(10 * expected, rel=1e-5)


def tiny_model(**overrides) -> MiniMindForCausalLM:
    torch.manual_seed(0)
    config = MiniMindConfig(**{"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
                               "num_key_value_heads": 2, **overrides})
    return MiniMindForCausalLM(config)


def test_layer_stats_match_a_direct_computation_for_pre_norm():
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    stats = layer_stats(model, ids)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        cos, sin = model.model.rotary_emb(torch.arange(12)[None], torch.float32)
        layers = model.model.layers
        for i, layer in enumerate(layers):
            x = hidden[i]
            # the last block's output is not in hidden_states (the final norm follows it): recompute it
            out = hidden[i + 1] if i + 1 < len(layers) else layer(x, (cos, sin), None)
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(2, 12, 4, 8).transpose(1, 2)
            k = attn.k_proj(h).view(2, 12, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            logits = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(torch.ones(12, 12).triu(1).bool(), -1e9)
            assert stats["max_attn_logit"][i] == pytest.approx(logits.max().item(), rel=1e-5)
            assert stats["residual_rms"][i] == pytest.approx(x.pow(2).mean().sqrt().item(), rel=1e-5)
            cosines = (x * out).sum(-1) / (x.norm(dim=-1) * out.norm(dim=-1))
            assert stats["block_cosine"][i] == pytest.approx(cosines.mean().item(), rel=1e-5)
            assert stats["massive_activation"][i] == pytest.approx((x.abs().max() / x.abs().median()).item(), rel=1e-5)
    assert model.training and not any(block._forward_hooks or block.self_attn._forward_pre_hooks for block in layers)


def test_layer_stats_leave_batchnorm_running_statistics_alone():
    model = tiny_model(norm_type="batchnorm")
    before = {name: b.clone() for name, b in model.named_buffers()}
    layer_stats(model, torch.randint(0, 64, (2, 12)))
    assert model.training and all(torch.equal(b, before[name]) for name, b in model.named_buffers())
    model(input_ids=torch.randint(0, 64, (2, 12)))  # a training-mode forward does move them: the check has teeth
    assert not all(torch.equal(b, before[name]) for name, b in model.named_buffers())


@pytest.mark.parametrize("position,qk_norm", [(p, q) for p in NORM_POSITIONS for q in QK_NORMS
                                              if p not in QKV_PLACEMENTS or q == "head"])  # HybridNorm needs head
def test_layer_stats_read_what_attention_sees_in_every_placement(position, qk_norm):
    """The hook must see the attention's real input: the block input itself where the placement has no norm
    before attention (post, reorder, deepnorm, Mix-LN's Post blocks), else that norm's output (times LayerNorm
    Scaling's factor). With unit-gain per-head QK-norm every logit is at most sqrt(head_dim)."""
    scaling = "depth" if position in ("pre", "mix") else "none"
    model = tiny_model(norm_position=position, qk_norm=qk_norm, norm_scaling=scaling, mix_ln_fraction=0.5,
                       num_hidden_layers=4, v_norm="head" if position in QKV_PLACEMENTS else "none")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    stats = layer_stats(model, ids)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        rope = model.model.rotary_emb(torch.arange(12)[None], torch.float32)
        for i, block in enumerate(model.model.layers):
            h = hidden[i]
            if block.plan.attn.before:
                h = getattr(block, block.plan.attn.before)(h) * block.plan.input_scale
            expected = max_attention_logit(*block.self_attn.project_qk(h, rope)[:2]).item()
            assert stats["max_attn_logit"][i] == pytest.approx(expected, rel=1e-5), i
            if qk_norm == "head":  # per-head RMS 1 (proj normalizes all heads together: no per-head bound)
                assert stats["max_attn_logit"][i] <= math.sqrt(8) + 1e-4
        assert stats["residual_rms"] == pytest.approx([rms(x).item() for x in hidden[:4]], rel=1e-5)


def test_layer_stats_between_steps_do_not_retrace_a_compiled_model():
    """The trainer compiles the model but takes the statistics from the raw one: no new graph at log steps."""
    torch._dynamo.reset()
    counters.clear()
    raw = tiny_model(qk_norm="head")
    compiled = torch.compile(raw, backend="eager")  # Dynamo's tracing and guards, without the C++ compile
    ids = torch.randint(0, 64, (2, 8))
    for step in range(4):
        compiled(input_ids=ids, shift_labels=ids).loss.backward()
        if step % 2:
            layer_stats(raw, ids)
    assert counters["stats"]["unique_graphs"] == 1


def test_trainer_logs_every_diagnostic_per_layer(tmp_path, tiny_flags_drawing_layers, monkeypatch):
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    args: Namespace = parse_args([
        *tiny_flags_drawing_layers, "--num_hidden_layers", "3", "--max_seq_len", "16", "--batch_size", "2", "--eval_steps", "1",
        "--max_steps", "4", "--log_interval", "2", "--eval_interval", "4", "--out_dir", str(tmp_path / "run")])
    assert not train(args)["diverged"]
    logged = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in logged] == [2, 4]
    for record in logged:
        for key in ("residual_rms", "layer_grad_norm", "block_cosine", "max_attn_logit", "massive_activation",
                    "excess_kurtosis", "attn_first_token"):
            assert len(record[key]) == 3 and all(math.isfinite(v) for v in record[key]), key
        assert all(-1 <= c <= 1 for c in record["block_cosine"]) and all(m >= 1 for m in record["massive_activation"])
    assert (tmp_path / "run" / "layers.png").stat().st_size > 0
