import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from model import NORM_POSITIONS, NORM_TYPES, MiniMindConfig, MiniMindForCausalLM, count_norms
from model.model_minimind import CACHE_FIELD, QKV_PLACEMENTS, RMSNorm
from tests.tiny import TINY, tiny_model

REPO = Path(__file__).resolve().parents[1]


def test_default_is_minimind2_small():
    cfg = MiniMindConfig()
    model = MiniMindForCausalLM(cfg)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (6400, 512, 8)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (8, 2, 1408)
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1e6, 1e-5)
    assert sum(p.numel() for p in model.parameters()) == 25_829_888
    assert count_norms(model) == 17
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_llama_module_names():
    keys = set(tiny_model().state_dict())
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert f"model.layers.0.self_attn.{name}.weight" in keys
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert f"model.layers.0.mlp.{name}.weight" in keys
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                 "model.layers.2.input_layernorm.weight", "model.layers.2.post_attention_layernorm.weight"):
        assert name in keys


@pytest.mark.parametrize("field,value,allowed", [
    ("num_attention_heads", 5, "divisor of hidden_size"),
    ("num_key_value_heads", 3, "divisor of num_attention_heads"),
    ("norm_type", "groupnorm", "rmsnorm"),
    ("norm_position", "middle", "pre"),
])
def test_bad_config_names_field_and_allowed_values(field, value, allowed):
    with pytest.raises(ValueError) as err:
        MiniMindConfig(**{**TINY, field: value})
    assert field in str(err.value) and allowed in str(err.value)


@pytest.mark.parametrize("norm_position", NORM_POSITIONS)
def test_causality(norm_position):
    qkv = {"qk_norm": "head", "v_norm": "head"} if norm_position in QKV_PLACEMENTS else {}  # HybridNorm needs them
    model = tiny_model(norm_position=norm_position, **qkv)
    x = torch.randint(0, 300, (2, 16))
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 300
    with torch.no_grad():
        a, b = model(x).logits, model(changed).logits
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=0)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


def test_kv_cache_decoding_matches_full_forward():
    model = tiny_model()
    x = torch.randint(0, 300, (2, 20))
    with torch.no_grad():
        full = model(x).logits
        out = model(x[:, :12], use_cache=True)
        steps = [out.logits]
        cache = getattr(out, CACHE_FIELD)
        for t in range(12, 20):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = getattr(out, CACHE_FIELD)
            steps.append(out.logits)
        # a multi-token chunk on top of a cache needs the explicit (offset) causal mask
        chunked = model(x[:, :15], use_cache=True)
        rest = model(x[:, 15:], past_key_values=getattr(chunked, CACHE_FIELD), use_cache=True).logits
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest, full[:, 15:], atol=1e-5, rtol=1e-5)


def test_generate_greedy_and_sampling():
    model = tiny_model()
    prompt = torch.randint(0, 300, (1, 6))
    greedy = model.generate(prompt, max_new_tokens=10, do_sample=False, eos_token_id=None)
    manual = prompt
    with torch.no_grad():
        for _ in range(10):
            manual = torch.cat([manual, model(manual).logits[:, -1:].argmax(-1)], 1)
    assert greedy.tolist() == manual.tolist()
    torch.manual_seed(1)
    s1 = model.generate(prompt, max_new_tokens=10, do_sample=True, top_k=20, top_p=0.9, eos_token_id=None)
    torch.manual_seed(1)
    s2 = model.generate(prompt, max_new_tokens=10, do_sample=True, top_k=20, top_p=0.9, eos_token_id=None)
    assert s1.shape == (1, 16) and s1.tolist() == s2.tolist()
    top1 = model.generate(prompt, max_new_tokens=10, do_sample=True, top_k=1, eos_token_id=None)
    assert top1.tolist() == greedy.tolist()  # sampling from the single most likely token is greedy decoding
    hot = model.generate(prompt, max_new_tokens=10, do_sample=True, temperature=5.0, eos_token_id=None)
    assert hot.tolist() != greedy.tolist()


def test_padded_batch_matches_unpadded():
    model = tiny_model()
    x = torch.randint(1, 300, (1, 8))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = model(x).logits
        got = model(padded, attention_mask=mask, position_ids=pos).logits[:, 3:]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_type", ["rmsnorm", "layernorm", "dyt"])
def test_save_load_round_trip(tmp_path, norm_type):
    model = tiny_model(norm_type=norm_type, norm_position="post")
    with torch.no_grad():  # make every parameter non-default so a missed weight would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, MiniMindForCausalLM) and loaded.config.norm_type == norm_type
    x = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)


def test_rmsnorm_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(4, 7, 64) * 3
    norm = RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = F.rms_norm(x, (64,), norm.weight, eps=1e-5)
    assert (norm(x) - ref).abs().max().item() <= 1e-6
    # a bf16 model: statistics in fp32 inside, bf16 out, within bf16 rounding of the fp32 result
    bf16 = norm.to(torch.bfloat16)(x.bfloat16())
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), ref, atol=0.05, rtol=0.02)


def test_initial_loss_is_ln_vocab():
    model = tiny_model(vocab_size=6400)
    x = torch.randint(0, 6400, (4, 64))
    with torch.no_grad():
        loss = model(x, labels=x).loss.item()
    assert abs(loss - math.log(6400)) < 0.1


def test_shift_labels_equals_hf_labels():
    model = tiny_model()
    w = torch.randint(0, 300, (2, 11))
    with torch.no_grad():
        hf = model(w, labels=w).loss
        aligned = model(w[:, :-1], shift_labels=w[:, 1:]).loss
        ref = F.cross_entropy(model(w).logits[:, :-1].reshape(-1, 300), w[:, 1:].reshape(-1))
    torch.testing.assert_close(hf, ref)
    torch.testing.assert_close(aligned, ref)


@pytest.mark.parametrize("norm_type", sorted(NORM_TYPES))
def test_bf16_autocast_forward_backward_on_cpu(norm_type):
    model = tiny_model(norm_type=norm_type).train()
    x = torch.randint(0, 300, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x[:, :-1], shift_labels=x[:, 1:])
    assert out.logits.dtype == torch.bfloat16
    out.loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_rope_keeps_queries_and_keys_in_the_autocast_dtype():
    """Under bf16 autocast the projections give bf16 q and k; RoPE's tables follow them instead of promoting
    them to fp32 (which attention would cast back). Without autocast everything stays fp32."""
    model = tiny_model()
    seen = []
    for layer in model.model.layers:
        project = layer.self_attn.project_qk
        layer.self_attn.project_qk = lambda *a, _p=project: seen.append(_p(*a)) or seen[-1]
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    with torch.autocast("cpu", torch.bfloat16):
        model(input_ids=ids)
    assert {t.dtype for qk in seen for t in qk[:2]} == {torch.bfloat16}
    seen.clear()
    model(input_ids=ids)
    assert {t.dtype for qk in seen for t in qk[:2]} == {torch.float32}
