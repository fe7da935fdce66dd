"""extras/interop/convert_from_minimind.py: MiniMind2 / MiniMind-3 state dicts, built from this repository's
own model under the key names MiniMind's published code uses, come back as checkpoints that compute exactly
the same logits and generate the same tokens with and without the KV cache; bad files are refused in one
line."""

import pytest
import safetensors.torch
import torch

from common.cli import run_cli
from data import DEFAULT_TOKENIZER_DIR, load_tokenizer
from eval_llm import load
from extras.interop import convert_from_minimind
from extras.interop.convert_to_hf import convert as convert_to_hf
from model import PRESETS, MiniMindForCausalLM
from tests.tiny import tiny_model

# The published defaults each import relies on when the shapes cannot tell (MiniMindConfig in
# model/model_minimind.py of jingyaogong/minimind: MiniMind2 as of 2026-01, MiniMind-3 as of 2026-05).
VERSION_EPS = {"2": 1e-5, "3": 1e-6}


def minimind_keys(layers: int, version: str) -> set[str]:
    """The state dict keys of MiniMind's MiniMindForCausalLM (dense, no MoE), as its trainers save them."""
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.down_proj",
                 "mlp.up_proj"]
    if version == "3":
        per_layer += ["self_attn.q_norm", "self_attn.k_norm"]
    keys = {f"model.layers.{i}.{name}.weight" for i in range(layers) for name in per_layer}
    return keys | {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}


def minimind_model(tokenizer, version: str, **overrides) -> MiniMindForCausalLM:
    """This repository's model shaped as a MiniMind of that version (2 layers, 4 heads), with non-trivial norm
    gains (the tiny model's small perturbations would leave near-ties that make greedy tokens fragile)."""
    model = tiny_model(perturb=False, **{"vocab_size": len(tokenizer), "num_hidden_layers": 2,
                                         "intermediate_size": 192, "rms_norm_eps": VERSION_EPS[version],
                                         "qk_norm": "head" if version == "3" else "none", **overrides})
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def save_pth(model: MiniMindForCausalLM, path, dtype=torch.float16) -> dict[str, torch.Tensor]:
    """What MiniMind's trainers write (state_dict with every tensor cast to half); returns it."""
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    torch.save(state, path)
    return state


@pytest.mark.parametrize("version,dtype", [("2", torch.float16), ("3", torch.float16), ("3", torch.float32)])
def test_import_gives_exactly_the_same_logits_and_the_same_tokens_with_the_cache(tmp_path, tiny_tokenizer_dir,
                                                                                version, dtype):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    source = minimind_model(tokenizer, version)
    state = save_pth(source, tmp_path / "pretrain_64.pth", dtype)
    assert set(state) == minimind_keys(2, version)
    # MiniMind2's head count is not in its shapes: the flag gives it (default 8); MiniMind-3's q_norm does.
    heads = 4 if version == "2" else None
    convert_from_minimind.convert(tmp_path / "pretrain_64.pth", tiny_tokenizer_dir, tmp_path / "out",
                                  num_attention_heads=heads)

    imported, _ = load(tmp_path / "out")  # as eval_llm.py reads it
    cfg = imported.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.rms_norm_eps, cfg.rope_theta, cfg.qk_norm,
            cfg.tie_word_embeddings) == (64, 2, 4, 2, 192, VERSION_EPS[version], 1e6, source.config.qk_norm,
                                         True)
    with torch.no_grad():
        source.load_state_dict({k: v.float() for k, v in state.items()})  # the values the .pth holds
        ids = torch.randint(0, len(tokenizer), (2, 24), generator=torch.Generator().manual_seed(1))
        assert torch.equal(imported(ids).logits, source(ids).logits)
    prompt = torch.tensor([[tokenizer.bos_token_id, *tokenizer.encode("Full fathom five")]])
    cached, uncached = (imported.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None,
                                          use_cache=use_cache) for use_cache in (True, False))
    looped = prompt
    with torch.no_grad():
        for _ in range(8):
            looped = torch.cat([looped, imported(looped).logits[:, -1:].argmax(-1)], 1)
    assert cached.tolist() == uncached.tolist() == looped.tolist()


def test_untied_minimind3_resume_file_stays_untied_and_exports(tmp_path, tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    source = minimind_model(tokenizer, "3", tie_word_embeddings=False)
    # MiniMind's *_resume.pth: the state dict under "model", beside the optimizer's state and counters
    state = save_pth(source, tmp_path / "full_sft_64_resume.pth", torch.float32)
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": []}, "epoch": 1, "step": 10},
               tmp_path / "full_sft_64_resume.pth")
    convert_from_minimind.convert(tmp_path / "full_sft_64_resume.pth", tiny_tokenizer_dir, tmp_path / "out")
    imported, _ = load(tmp_path / "out")
    assert not imported.config.tie_word_embeddings
    ids = torch.arange(16)[None] * 3
    with torch.no_grad():
        assert torch.equal(imported(ids).logits, source(ids).logits)
    assert convert_to_hf(tmp_path / "out", tmp_path / "hf") == "Qwen3ForCausalLM"


DENSE_KEYS = [f"model.layers.0.mlp.{name}_proj.weight" for name in ("down", "gate", "up")]
MOE_KEYS = [key.replace("mlp.", "mlp.experts.0.") for key in DENSE_KEYS] + ["model.layers.0.mlp.gate.weight"]
NON_FINITE = ("model.layers.0.mlp.down_proj.weight holds 2 non-finite values (nan or inf) of 12,288, so the "
              "run that saved it had diverged or the file is damaged; import a checkpoint saved before that")
NOT_HELD = "{pth}: not a MiniMind2 state dict this repository's model can hold"


@pytest.mark.parametrize("case,line", [
    ("moe", NOT_HELD + f"; unknown keys: {', '.join(MOE_KEYS)}; missing keys: {', '.join(DENSE_KEYS)}"),
    ("missing", NOT_HELD + "; missing keys: model.layers.1.post_attention_layernorm.weight"),
    ("nan", "{pth}: " + NON_FINITE), ("inf", "{pth}: " + NON_FINITE),
    ("not_a_pth", "{pth}: cannot read it as a PyTorch state dict ("),
    ("wrong_tokenizer", "{tokenizer}: the tokenizer has 400 tokens but the weights' vocabulary has 300; pass "
                        "the tokenizer folder of the MiniMind version that trained them"),
    ("version_3_of_a_minimind2", "the state dict has no model.layers.0.self_attn.q_norm.weight, which "
                                 "MiniMind-3 has; is it a MiniMind-3 checkpoint?"),
    # the same size as MiniMind's: without this refusal it would import without a word
    ("shipped_tokenizer", "{tokenizer}: this repository's tokenizer (trained on the plays), not MiniMind's; "
                          "pass MiniMind's tokenizer folder (model/ in its repository)"),
    ("no_tokenizer", "{tokenizer}: no tokenizer.json; pass MiniMind's tokenizer folder (model/ in its "
                     "repository)"),
    # torch.load reads it, but the head count would be the version's default, not the folder's
    ("model_folder", "{pth}: a model folder's weights, not MiniMind's .pth; their folder's config.json "
                     "gives their shapes (eval_llm.py loads this repository's and the exported families' "
                     "folders as they are)"),
])
def test_bad_input_is_one_line_on_the_command_line_and_writes_nothing(tmp_path, tiny_tokenizer_dir, capsys,
                                                                     case, line):
    pth = tmp_path / ("model.safetensors" if case == "model_folder" else "m.pth")
    state = save_pth(minimind_model(load_tokenizer(tiny_tokenizer_dir), "2"), pth)
    if case == "moe":  # MiniMind's MoE variant has a router and experts where the dense MLP is
        state = {k: state[k] for k in state.keys() - DENSE_KEYS} | dict.fromkeys(MOE_KEYS, torch.zeros(4))
    elif case == "missing":
        del state["model.layers.1.post_attention_layernorm.weight"]
    elif case in ("nan", "inf"):
        state["model.layers.0.mlp.down_proj.weight"][3, :2] = float(case)  # the first in state dict order
        state["model.layers.1.self_attn.q_proj.weight"][0, 0] = float(case)
    elif case == "wrong_tokenizer":
        state = save_pth(tiny_model(num_hidden_layers=1), pth)  # a vocabulary of 300, the tokenizer's is 400
    if case != "model_folder":
        torch.save(state, pth)
    if case == "not_a_pth":
        pth.write_bytes(b"not a pickle")
    elif case == "model_folder":
        safetensors.torch.save_file({k: v.clone().contiguous() for k, v in state.items()}, pth)
    flags = ["--version", "3"] if case == "version_3_of_a_minimind2" else ["--num_attention_heads", "4"]
    tokenizer = {"shipped_tokenizer": str(DEFAULT_TOKENIZER_DIR), "no_tokenizer": str(tmp_path)}.get(
        case, tiny_tokenizer_dir)
    argv = [str(pth), tokenizer, str(tmp_path / "out"), *flags]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: convert_from_minimind.main(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    expected = "error: " + line.format(pth=pth, tokenizer=tokenizer)
    assert exit_info.value.code == 2 and len(lines) == 1
    assert lines[0].startswith(expected) if case == "not_a_pth" else lines[0] == expected
    assert not (tmp_path / "out").exists()


def test_a_minimind3_checkpoint_imports_as_the_minimind3_preset(tmp_path, tiny_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    preset = PRESETS["minimind3"]
    source = minimind_model(tokenizer, "3", **{**preset, "num_hidden_layers": 1})  # the shapes suffice
    save_pth(source, tmp_path / "pretrain_768.pth")
    imported, _, _ = convert_from_minimind.import_minimind(tmp_path / "pretrain_768.pth", tiny_tokenizer_dir)
    assert {field: getattr(imported.config, field) for field in preset} == {**preset, "num_hidden_layers": 1}
    assert imported.config.tie_word_embeddings
