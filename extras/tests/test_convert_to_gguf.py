"""extras/interop/convert_to_gguf.py: the files it writes, read back by the gguf package and run by a small
model of llama.cpp's forward pass (rotation layout, norm placement, output fallback per architecture);
and extras/interop/compare_llama_cpp.py, which runs them in llama.cpp itself where llama-cpp-python is
installed."""

import copy
import json
import math
import re
import sys
import types
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.cli import UserError, run_cli
from extras.interop import compare_llama_cpp, convert_to_gguf
from model import MiniMindForCausalLM
from tests.tiny import tiny_model

FAMILIES = {
    "llama": {},
    "llama-noparam-untied": {"norm_type": "rmsnorm_noparam", "tie_word_embeddings": False},
    "qwen3": {"qk_norm": "head"},
    "olmo2": {"norm_position": "reorder", "qk_norm": "proj"},
}


def tiny_checkpoint(path: Path, tokenizer, **overrides) -> MiniMindForCausalLM:
    """A saved tiny model with non-trivial norm gains (a gain of 1 hides a misplaced norm), its tokenizer."""
    model = tiny_model(perturb=False, vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                       intermediate_size=64, rope_theta=500.0, rms_norm_eps=1e-6, max_position_embeddings=128,
                       **overrides)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def read_gguf(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    reader = gguf.GGUFReader(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
               .reshape(tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors}
    return meta, tensors


def rms(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def rope(x: torch.Tensor, theta: float, adjacent_pairs: bool) -> torch.Tensor:
    """x: [seq, heads, d]. llama.cpp's Llama rotates dimensions (2i, 2i+1), Qwen3 and OLMo 2 (i, i+d/2)."""
    d = x.shape[-1]
    angle = torch.arange(x.shape[0])[:, None] * theta ** (-torch.arange(0, d, 2) / d)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    a, b = (x[..., 0::2], x[..., 1::2]) if adjacent_pairs else (x[..., : d // 2], x[..., d // 2 :])
    a, b = a * cos - b * sin, a * sin + b * cos
    return torch.stack((a, b), -1).flatten(-2) if adjacent_pairs else torch.cat((a, b), -1)


def llama_cpp_style_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """Logits [seq, vocab] for one sequence, computed from the GGUF file alone as llama.cpp's graphs do."""
    meta, t = read_gguf(path)
    arch = meta["general.architecture"]
    n_head, n_kv = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    eps, theta = meta[f"{arch}.attention.layer_norm_rms_epsilon"], meta[f"{arch}.rope.freq_base"]
    seq, hd = len(ids), meta[f"{arch}.embedding_length"] // n_head
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    x = t["token_embd.weight"][ids]
    for i in range(meta[f"{arch}.block_count"]):
        w = {k.removeprefix(f"blk.{i}."): v for k, v in t.items() if k.startswith(f"blk.{i}.")}
        h = x if arch == "olmo2" else rms(x, w["attn_norm.weight"], eps)
        q, k, v = h @ w["attn_q.weight"].T, h @ w["attn_k.weight"].T, h @ w["attn_v.weight"].T
        if arch == "olmo2":  # QK-norm over the whole projection
            q, k = rms(q, w["attn_q_norm.weight"], eps), rms(k, w["attn_k_norm.weight"], eps)
        q, k, v = q.view(seq, n_head, hd), k.view(seq, n_kv, hd), v.view(seq, n_kv, hd)
        if arch == "qwen3":  # QK-norm per head
            q, k = rms(q, w["attn_q_norm.weight"], eps), rms(k, w["attn_k_norm.weight"], eps)
        q, k = rope(q, theta, arch == "llama"), rope(k, theta, arch == "llama")
        k, v = k.repeat_interleave(n_head // n_kv, 1), v.repeat_interleave(n_head // n_kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        attn = torch.einsum("hqk,khd->qhd", scores.masked_fill(~causal, -math.inf).softmax(-1), v)
        o = attn.reshape(seq, -1) @ w["attn_output.weight"].T
        x = x + (rms(o, w["post_attention_norm.weight"], eps) if arch == "olmo2" else o)
        h = x if arch == "olmo2" else rms(x, w["ffn_norm.weight"], eps)
        m = (F.silu(h @ w["ffn_gate.weight"].T) * (h @ w["ffn_up.weight"].T)) @ w["ffn_down.weight"].T
        x = x + (rms(m, w["post_ffw_norm.weight"], eps) if arch == "olmo2" else m)
    # llama.cpp's Llama and Qwen3 loaders fall back to the embeddings for a missing output, OLMo 2's does not
    assert "output.weight" in t or arch != "olmo2", "llama.cpp's OLMo 2 loader needs output.weight"
    return rms(x, t["output_norm.weight"], eps) @ t.get("output.weight", t["token_embd.weight"]).T


@pytest.mark.parametrize("family,outtype", [*((f, "f32") for f in FAMILIES), ("qwen3", "f16"),
                                            ("qwen3", "bf16")])
def test_gguf_computes_what_the_checkpoint_does(tmp_path, tiny_tokenizer, family, outtype):
    model = tiny_checkpoint(tmp_path / "src", tiny_tokenizer, **FAMILIES[family])
    arch = convert_to_gguf.convert(tmp_path / "src", tmp_path / "m.gguf", outtype)
    assert arch == family.split("-")[0]
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    assert stored == {name: gguf.GGMLQuantizationType.F32 if name.endswith("norm.weight")
                      else gguf.GGMLQuantizationType[outtype.upper()] for name in stored}
    # The model with its matrices rounded as the file stores them (nearest even) computes what the file does.
    ids = torch.randint(0, model.config.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[outtype]
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(param.to(dtype))
        expected = model(ids[None]).logits[0]
    assert (llama_cpp_style_logits(tmp_path / "m.gguf", ids) - expected).abs().max().item() <= 1e-4

    meta, tensors = read_gguf(tmp_path / "m.gguf")
    cfg = model.config
    own = {k.removeprefix(f"{arch}."): v for k, v in meta.items() if k.startswith(f"{arch}.")}
    assert own == pytest.approx({
        "context_length": 128, "embedding_length": 32, "feed_forward_length": 64, "block_count": 2,
        "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 8,
        "attention.value_length": 8, "rope.dimension_count": 8, "rope.freq_base": 500.0,
        "attention.layer_norm_rms_epsilon": 1e-6, "vocab_size": cfg.vocab_size})
    assert ("output.weight" in tensors) == (arch == "olmo2" or not cfg.tie_word_embeddings)

    spec = json.loads((tmp_path / "src" / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: tok for tok, i in spec["model"]["vocab"].items()}
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"] == [by_id[i] for i in range(cfg.vocab_size)]
    assert meta["tokenizer.ggml.merges"] == [" ".join(m) for m in spec["model"]["merges"]]
    assert meta["tokenizer.ggml.token_type"][:4] == [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL]
    assert meta["tokenizer.ggml.eos_token_id"] == meta["tokenizer.ggml.bos_token_id"] == 0  # <|endoftext|>
    # llama.cpp starts a prompt after bos, the document separator, as eval_llm does
    assert meta["tokenizer.ggml.add_bos_token"] is True


def test_a_tokenizer_whose_bos_starts_its_chat_template_adds_none(tmp_path, tiny_tokenizer):
    """MiniMind's: bos <|im_start|>, eos <|im_end|>; its template writes <|im_start|> itself."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.bos_token, tokenizer.eos_token = "<|im_start|>", "<|im_end|>"
    tiny_checkpoint(tmp_path / "src", tokenizer)
    convert_to_gguf.convert(tmp_path / "src", tmp_path / "m.gguf", "f32")
    meta = read_gguf(tmp_path / "m.gguf")[0]
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert meta["tokenizer.ggml.add_bos_token"] is False


def test_a_step_folder_s_file_is_named_by_its_run(tmp_path, tiny_tokenizer):
    tiny_checkpoint(tmp_path / "hamlet" / "step-000004", tiny_tokenizer)
    convert_to_gguf.convert(tmp_path / "hamlet" / "step-000004", tmp_path / "m.gguf", "f32")
    assert read_gguf(tmp_path / "m.gguf")[0]["general.name"] == "hamlet"


# case -> (the checkpoint's config overrides, the one line printed after "error: ", as a regex). What no
# Hugging Face family computes is refused by the export both converters share (test_hf_export.py: every case).
REFUSALS = {
    "peri": ({"norm_position": "peri"}, "cannot export .*peri.*"),
    "gemma2": ({"norm_position": "peri", "norm_gain": "one_plus_w", "embed_norm": "scale"},
               "a gemma2 model has no GGUF export.*"),
    "beyond_f16": ({}, re.escape("tensor blk.1.ffn_down.weight has values up to 7e+04 in magnitude, beyond "
                                 "--outtype f16's largest (65504), so it would be stored as inf; export with "
                                 "--outtype bf16 or f32; nothing was written")),
    "existing_output": ({}, ".*m.gguf already exists; choose a new output file"),
    "bad_write": ({}, "tensor .* read back from the GGUF file differs from the export; nothing was written"),
    "prefix_space": ({}, ".*: GGUF export writes GPT-2-style byte-level BPE tokenizers only .*"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refuses_in_one_line_writing_nothing(tmp_path, tiny_tokenizer, monkeypatch, capsys, case):
    overrides, line = REFUSALS[case]
    model = tiny_checkpoint(tmp_path / "src", tiny_tokenizer, **overrides)
    flags = []
    if case == "beyond_f16":
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight[0, 0] = -7e4  # f16 ends at 65504: stored as -inf
        model.save_pretrained(tmp_path / "src")
        flags = ["--outtype", "f16"]
    elif case == "existing_output":
        (tmp_path / "m.gguf").write_bytes(b"mine")
    elif case == "bad_write":  # a writer that alters the stored values is caught by the read-back
        monkeypatch.setattr(gguf.quants, "quantize", lambda data, qtype: (data + 1e-3).astype(np.float32))
    elif case == "prefix_space":  # " Hello" and "Hello" would tokenize alike: not llama.cpp's "gpt-2"
        spec = json.loads((tmp_path / "src" / "tokenizer.json").read_text(encoding="utf-8"))
        spec["pre_tokenizer"]["add_prefix_space"] = True
        (tmp_path / "src" / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    capsys.readouterr()  # save_pretrained's progress bar
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: convert_to_gguf.main([str(tmp_path / "src"), str(tmp_path / "m.gguf"), *flags]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and re.fullmatch("error: " + line, lines[0]), lines
    left = {p.name: p.read_bytes() for p in tmp_path.glob("*m.gguf*")}
    assert left == ({"m.gguf": b"mine"} if case == "existing_output" else {})
    if case == "beyond_f16":  # as the line suggests, bf16 holds it
        convert_to_gguf.convert(tmp_path / "src", tmp_path / "m.gguf", "bf16")
        assert read_gguf(tmp_path / "m.gguf")[1]["blk.1.ffn_down.weight"].isfinite().all()



@pytest.mark.slow  # loads llama.cpp three times and scores held-out windows both ways
@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2"])
def test_llama_cpp_runs_the_file_as_transformers_runs_the_export(tmp_path, tiny_tokenizer, family):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (installing "
                                            "it builds llama.cpp; docs/gguf.md gives the commands)")
    tiny_checkpoint(tmp_path / "ckpt", tiny_tokenizer, **FAMILIES[family])
    convert_to_gguf.convert(tmp_path / "ckpt", tmp_path / "model.gguf")
    r = compare_llama_cpp.compare(tmp_path / "ckpt", tmp_path / "model.gguf", context=64,
                                  windows=4, new_tokens=10, threads=1)
    assert r["documents_with_equal_ids"] == r["documents"] > 0
    assert r["greedy_llama_cpp"] == r["greedy_transformers"]
    assert r["ppl_llama_cpp"] == pytest.approx(r["ppl_transformers"], rel=1e-3)


def test_threads_sets_every_llama_cpp_thread_count(tmp_path, monkeypatch):
    """--threads 1 is one thread for single tokens (n_threads) and for whole prompts
    (n_threads_batch, which would otherwise take every core); without llama_cpp, one line."""
    opened = {}
    fake = types.ModuleType("llama_cpp")
    fake.Llama = lambda **kwargs: opened.update(kwargs)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    (tmp_path / "m.gguf").write_bytes(b"")
    compare_llama_cpp.open_gguf(tmp_path / "m.gguf", context=64, threads=1)
    assert opened["n_threads"] == opened["n_threads_batch"] == 1
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what a missing package raises
    with pytest.raises(UserError, match="pip install llama-cpp-python"):
        compare_llama_cpp.open_gguf(tmp_path / "m.gguf", context=64, threads=1)
    # the command line says so before it loads the model and the data
    monkeypatch.setattr(compare_llama_cpp, "export_model", lambda src: pytest.fail("loaded first"))
    with pytest.raises(UserError, match="pip install llama-cpp-python"):
        compare_llama_cpp.main([str(tmp_path), str(tmp_path / "m.gguf")])
