"""trainer/diagnostics.py: the per-layer statistics on hand-built cases, the hooks that gather them from a
real model (every placement), the MFU peaks by device name, and the trainer's records of them."""

import json
import math
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from model import NORM_POSITIONS
from model.model_minimind import QKV_PLACEMENTS, apply_rotary
from tests.tiny import TINY, ids, tiny_model
from trainer.args import parse_args
from trainer.diagnostics import (
    block_cosine,
    excess_kurtosis,
    first_token_attention,
    layer_stats,
    massive_activation_ratio,
    max_attention_logit,
    peak_flops,
    rms,
)
from trainer.plots import LAYER_PANELS, plot_layer_profiles
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

H, KV = TINY["num_attention_heads"], TINY["num_key_value_heads"]
D = TINY["hidden_size"] // H


def test_cosine_of_identical_orthogonal_and_opposite_streams():
    x = torch.randn(2, 5, 16)
    assert block_cosine(x, x).item() == pytest.approx(1.0)
    assert block_cosine(x, 3 * x).item() == pytest.approx(1.0)  # a block that only rescales: no turn
    assert block_cosine(x, -x).item() == pytest.approx(-1.0)
    a, b = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    a[..., 0], b[0, 0, 1], b[0, 1, 0] = 1.0, 1.0, 1.0  # token 0 orthogonal (0), token 1 identical (1)
    assert block_cosine(a, b).item() == pytest.approx(0.5)


def test_massive_activation_ratio_and_kurtosis_find_one_outlier():
    x = torch.ones(2, 8, 32)
    assert massive_activation_ratio(x).item() == pytest.approx(1.0)
    x[1, 3, 7] = -1000.0  # sign does not matter: it is a magnitude
    assert massive_activation_ratio(x).item() == pytest.approx(1000.0)
    assert rms(torch.full((3, 4), -2.0)).item() == pytest.approx(2.0)
    assert excess_kurtosis(torch.tensor([1.0, -1.0] * 50)).item() == pytest.approx(-2.0)  # two points: 1 - 3
    spike = torch.zeros(1000)
    spike[0] = 1.0  # one outlier among zeros: kurtosis ~ n
    assert excess_kurtosis(spike).item() == pytest.approx(1000 - 2 - 3 + 1 / 999, rel=1e-3)


def test_max_attention_logit_counts_only_causal_pairs_and_groups_heads():
    # 1 sequence, 2 query heads sharing 1 key head, 3 positions, head_dim 4
    q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 1, 3, 4)
    k[0, 0, 2, 0] = 10.0  # only the last key is large
    q[0, 0, 0, 0] = 50.0  # head 0 asks for it from position 0: in the future, must not count
    q[0, 1, 2, 0] = 3.0  # head 1 asks for it from position 2: allowed, logit 3 * 10 / sqrt(4)
    assert max_attention_logit(q, k).item() == pytest.approx(15.0)
    q[0, 1, 2, 0] = -3.0  # every allowed logit is now <= 0; the diagonal-and-below zeros win
    assert max_attention_logit(q, k).item() == pytest.approx(0.0)


def test_first_token_attention_on_hand_built_cases():
    seq = 5
    q, k = torch.zeros(2, H, seq, D), torch.randn(2, KV, seq, D)  # q = 0: query t spreads over t + 1 keys
    expected = sum(1 / (t + 1) for t in range(1, seq)) / (seq - 1)  # query 0 has no choice: not counted
    assert first_token_attention(q, k).item() == pytest.approx(expected)
    q[..., 0], k[:, :, 0, 0] = 1.0, 100.0  # every query looks at the first key only
    assert first_token_attention(q, k).item() == pytest.approx(1.0)


def test_layer_stats_match_a_direct_computation():
    model = tiny_model().train()
    x = ids()
    stats = layer_stats(model, x)
    layers = model.model.layers
    with torch.no_grad():
        hidden = model(x, output_hidden_states=True).hidden_states
        cos, sin = model.model.rotary_emb(torch.arange(12)[None], torch.float32)
        for i, layer in enumerate(layers):
            h = hidden[i]
            # the last block's output is not in hidden_states (the final norm follows it): recompute it
            out = hidden[i + 1] if i + 1 < len(layers) else layer(h, (cos, sin), None)
            n = layer.input_layernorm(h)
            q = layer.self_attn.q_proj(n).view(2, 12, H, D).transpose(1, 2)
            k = layer.self_attn.k_proj(n).view(2, 12, KV, D).transpose(1, 2)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin).repeat_interleave(H // KV, 1)
            future = torch.ones(12, 12).triu(1).bool()
            logits = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(future, -math.inf)
            probs = logits.softmax(-1)[:, :, 1:]  # the queries that have a choice
            assert stats["max_attn_logit"][i] == pytest.approx(logits.max().item(), rel=1e-5)
            assert stats["attn_first_token"][i] == pytest.approx(probs[..., 0].mean().item(), rel=1e-5)
            assert stats["residual_rms"][i] == pytest.approx(h.pow(2).mean().sqrt().item(), rel=1e-5)
            cosines = (h * out).sum(-1) / (h.norm(dim=-1) * out.norm(dim=-1))
            assert stats["block_cosine"][i] == pytest.approx(cosines.mean().item(), rel=1e-5)
            massive = (h.abs().max() / h.abs().median()).item()
            assert stats["massive_activation"][i] == pytest.approx(massive, rel=1e-5)
            s = h.flatten().double()
            kurtosis = ((s - s.mean()) ** 4).mean() / ((s - s.mean()) ** 2).mean() ** 2 - 3
            assert stats["excess_kurtosis"][i] == pytest.approx(kurtosis.item(), rel=1e-5, abs=1e-6)
    assert model.training
    assert not any(block._forward_hooks or block.self_attn._forward_pre_hooks for block in layers)


@pytest.mark.parametrize("position,qk_norm", [(p, q) for p in NORM_POSITIONS for q in ("none", "head", "proj")
                                              if p not in QKV_PLACEMENTS or q == "head"])  # as HybridNorm
def test_layer_stats_read_what_attention_sees_in_every_placement(position, qk_norm):
    """The hook sees the attention's real input: the block input where no norm comes before attention, else
    that norm's output (times LayerNorm Scaling's). With unit-gain per-head QK-norm logits are <= sqrt(d)."""
    scaling = "depth" if position in ("pre", "mix") else "none"
    model = tiny_model(perturb=False, norm_position=position, qk_norm=qk_norm, norm_scaling=scaling,
                       mix_ln_fraction=0.5, v_norm="head" if position in QKV_PLACEMENTS else "none").train()
    stats = layer_stats(model, ids(seed=2))
    with torch.no_grad():
        hidden = model(input_ids=ids(seed=2), output_hidden_states=True).hidden_states
        rope = model.model.rotary_emb(torch.arange(12)[None], torch.float32)
        for i, block in enumerate(model.model.layers):
            h = hidden[i]
            if block.plan.attn.before:
                h = getattr(block, block.plan.attn.before)(h) * block.plan.input_scale
            expected = max_attention_logit(*block.self_attn.project_qk(h, rope)[:2]).item()
            assert stats["max_attn_logit"][i] == pytest.approx(expected, rel=1e-5), i
            if qk_norm == "head":  # per-head RMS 1 (proj normalizes all heads together: no per-head bound)
                assert stats["max_attn_logit"][i] <= math.sqrt(D) + 1e-4
        assert stats["residual_rms"] == pytest.approx([rms(x).item() for x in hidden[:4]], rel=1e-5)


def test_layer_stats_between_steps_do_not_retrace_a_compiled_model(fresh_dynamo):
    """The trainer compiles the model but takes the statistics from the raw one: no new graph at log steps."""
    torch._dynamo.reset()
    counters.clear()
    raw = tiny_model(perturb=False, qk_norm="head").train()
    compiled = torch.compile(raw, backend="eager")  # Dynamo's tracing and guards, without the C++ compile
    x = ids(seq=8)
    for step in range(4):
        compiled(input_ids=x, shift_labels=x).loss.backward()
        if step % 2:
            layer_stats(raw, x)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H200", 989),
    ("NVIDIA H200 NVL", 835), ("NVIDIA A100-SXM4-40GB", 312), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A100-PCIE-40GB", 312), ("NVIDIA A100 80GB PCIe", 312), ("NVIDIA L4", 121), ("NVIDIA L40S", 362),
    ("NVIDIA GeForce RTX 4090", 165), ("NVIDIA GeForce RTX 3090", 71),
    # not guessed: MIG slices (a share of the SMs), other cards, variants of a listed name
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None), ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),
    ("NVIDIA GH200 480GB", None), ("NVIDIA GeForce RTX 4090 D", None), ("NVIDIA L40", None),
    ("Tesla T4", None),
])
def test_mfu_peak_by_exact_device_name(name, tflops):
    peak = peak_flops(torch.device("cuda"), torch.bfloat16, name)
    assert (peak and peak / 1e12) == tflops


def test_no_peak_off_gpu_or_in_fp32():
    assert peak_flops(torch.device("cpu"), torch.bfloat16) is None
    assert peak_flops(torch.device("cuda"), torch.float32) is None


def test_trainer_logs_every_diagnostic_per_layer(tmp_path, tiny_flags_drawing_layers):
    args: Namespace = parse_args([
        *tiny_flags_drawing_layers, "--num_hidden_layers", "3", "--max_seq_len", "16", "--batch_size", "2",
        "--eval_steps", "1", "--max_steps", "4", "--log_interval", "2", "--eval_interval", "4",
        "--qk_norm", "head", "--out_dir", str(tmp_path / "run")])
    assert not train(args)["diverged"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["variant"] == "pre+qk_head-rmsnorm"
    logged = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in logged] == [2, 4]
    for record in logged:
        for key in ("residual_rms", "layer_grad_norm", "block_cosine", "max_attn_logit", "massive_activation",
                    "excess_kurtosis", "attn_first_token"):
            assert len(record[key]) == 3 and all(math.isfinite(v) for v in record[key]), key
        assert all(-1 <= c <= 1 for c in record["block_cosine"])
        assert all(m >= 1 for m in record["massive_activation"])
        assert all(0 < a <= 1 for a in record["attn_first_token"])
    assert (tmp_path / "run" / "layers.png").stat().st_size > 0


def test_layers_png_of_a_run_with_no_positive_value_to_log_scale_draws_without_a_warning(tmp_path):
    """A diverged run (`--learning_rate 50 --grad_clip 0`, docs/training.md) logs gradient norms of 0 once its
    logits saturate: that panel falls back to a linear axis (pytest turns a warning raised from the project
    into an error)."""
    record = {"step": 10, "split": "train", **{key: [1.0, 2.0] for key, _, _ in LAYER_PANELS}}
    record["layer_grad_norm"] = [0.0, 0.0]
    plot_layer_profiles({"diverged": [record]}, tmp_path / "layers.png")
    assert (tmp_path / "layers.png").stat().st_size > 0


def test_layers_png_log_panels_read_in_plain_numbers(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    labels = []

    def record(fig, path, **kwargs):
        fig.canvas.draw()
        labels.extend(t.get_text() for ax in fig.axes if ax.get_yscale() != "linear"
                      for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text())
        Path(path).write_bytes(b"")
    monkeypatch.setattr(Figure, "savefig", record)
    record_ = {"step": 10, "split": "train", **{key: [1.5, 40.0] for key, _, _ in LAYER_PANELS}}
    plot_layer_profiles({"run": [record_]}, tmp_path / "layers.png")
    assert labels and all(float(text.replace("\N{MINUS SIGN}", "-")) >= 0 for text in labels), labels
