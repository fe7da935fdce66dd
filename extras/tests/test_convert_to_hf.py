"""extras/interop/convert_to_hf.py: every family's export of a trained checkpoint is what eval_llm.py names
and measures; the Gemma 2 export carries the soft-cap; the tokenizer is written for transformers 4 and 5; a
damaged checkpoint is refused in one line by both converters, and a run folder exports its newest step that
loads."""

import io
import json
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Gemma2ForCausalLM

import eval_llm
from common.cli import UserError, run_cli
from data import load_tokenizer
from extras.interop import compare_llama_cpp, convert_to_gguf, convert_to_hf
from extras.interop.hf_export import FAMILIES
from tests.tiny import ids, tiny_model
from trainer import checkpoint
from trainer.args import parse_args
from trainer.checkpoint import step_folders
from trainer.train_pretrain import train


@pytest.mark.parametrize("switches,family", FAMILIES.items(), ids=list(FAMILIES.values()))
def test_eval_llm_names_each_exported_family_by_its_model_type(switches, family, tiny_flags, tiny_corpus,
                                                                tmp_path, capsys):
    flags = [f"--{name}={value}" for name, value in zip(
        ("norm_position", "qk_norm", "norm_gain", "embed_norm"), switches, strict=True)]
    train(parse_args([*tiny_flags, *flags, "--out_dir", str(tmp_path / "run"), "--max_steps", "3"]))
    convert_to_hf.convert(tmp_path / "run", tmp_path / "hf")
    capsys.readouterr()
    eval_llm.main(["--device", "cpu", "--model_path", str(tmp_path / "hf"), "--eval_data", tiny_corpus,
                   "--seq_len", "16", "--batch_size", "4", "--eval_batches", "1"])
    header, row = capsys.readouterr().out.strip().splitlines()[-2:]
    model_type = json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"]  # gemma3_text
    assert model_type.startswith(family)
    assert header.split()[:2] == ["checkpoint", "variant"] and row.split()[:2] == ["hf", model_type]


def test_gemma2_export_carries_the_logit_softcap(tmp_path):
    model = tiny_model(norm_position="peri", norm_gain="one_plus_w", embed_norm="scale", logit_softcap=0.05)
    model.save_pretrained(tmp_path / "src")  # a cap far below the logits, so it shapes every one
    assert convert_to_hf.convert(tmp_path / "src", tmp_path / "dst") == "Gemma2ForCausalLM"
    exported = Gemma2ForCausalLM.from_pretrained(tmp_path / "dst").eval()
    with torch.no_grad():
        assert (exported(ids()).logits - model(ids()).logits).abs().max().item() <= 1e-4


def test_the_exported_tokenizer_loads_as_the_generic_class_with_the_same_ids(tmp_path, tiny_tokenizer_dir,
                                                                             tiny_texts):
    tokenizer = load_tokenizer(tiny_tokenizer_dir)  # with further special tokens, as MiniMind's tokenizer has
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|image_pad|>", "<|audio_pad|>"]})
    tiny_model(perturb=False, vocab_size=len(tokenizer)).save_pretrained(tmp_path / "src")
    tokenizer.save_pretrained(tmp_path / "src")
    config = tmp_path / "src" / "tokenizer_config.json"  # naming code of its own, which is not exported
    foreign = {"auto_map": {"AutoTokenizer": ["x.X", None]}}
    config.write_text(json.dumps(json.loads(config.read_text()) | foreign))
    convert_to_hf.convert(tmp_path / "src", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "auto_map" not in config
    # transformers 4 (llama.cpp's converter pins it) reads extra_special_tokens as a dict and fails on a list
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "extra_special_tokens" not in config
    assert config["additional_special_tokens"] == ["<|image_pad|>", "<|audio_pad|>"]
    exported = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "hf"))
    raw = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    for text in [*tiny_texts[-3:], "<|im_start|>user<|im_end|><|image_pad|>"]:
        assert exported(text)["input_ids"] == raw.encode(text).ids == tokenizer(text)["input_ids"]


def test_an_export_without_a_tokenizer_says_so(tmp_path, capsys):
    """eval_llm, and any user of the export, needs one: the GGUF converter refuses such a source."""
    tiny_model(perturb=False).save_pretrained(tmp_path / "src")
    convert_to_hf.convert(tmp_path / "src", tmp_path / "hf")
    no_tokenizer = f"; no tokenizer: {tmp_path / 'src'} has no tokenizer.json"
    assert capsys.readouterr().out.strip().endswith(no_tokenizer)


@pytest.mark.parametrize("converter", [convert_to_hf, convert_to_gguf], ids=["hf", "gguf"])
def test_converters_refuse_a_damaged_step_and_export_a_runs_newest_intact_one(converter, tiny_tokenizer,
                                                                              tmp_path, capsys):
    run = tmp_path / "run"  # as the trainer writes it: steps 2 and 4, weights seeded by the step
    for step in (2, 4):
        model = tiny_model(step, perturb=False, vocab_size=len(tiny_tokenizer))

        def write(folder, model=model):
            model.save_pretrained(folder)
            tiny_tokenizer.save_pretrained(folder)
        checkpoint.save(run, step, write, keep=2)
    weights = run / "step-000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short, as a full disk or a killed copy leaves it
    dst = tmp_path / ("export.gguf" if converter is convert_to_gguf else "export")
    with pytest.raises(UserError) as err:
        converter.convert(run / "step-000004", dst)
    assert re.fullmatch(r".*step-000004: no checkpoint loads \(step-000004: .*\)", str(err.value))
    assert "\n" not in str(err.value) and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    capsys.readouterr()
    converter.convert(run, dst)  # the run folder: its newest step that loads, with a warning
    assert "step-000004 cannot be loaded" in capsys.readouterr().err
    if converter is convert_to_hf:  # the same module names: the export holds step 2's tensors unchanged
        exported = AutoModelForCausalLM.from_pretrained(dst).state_dict()
        step_2 = tiny_model(2, perturb=False, vocab_size=exported["model.embed_tokens.weight"].shape[0])
        assert all(torch.equal(t, step_2.state_dict()[k]) for k, t in exported.items())



@pytest.mark.parametrize("converter", [convert_to_hf, convert_to_gguf], ids=["hf", "gguf"])
def test_converters_refuse_a_tokenizer_the_model_was_not_trained_with(converter, trained_run,
                                                                     other_tokenizer_dir, tmp_path):
    """A step folder whose tokenizer.json of the same size was swapped: its training state records the one."""
    folder = Path(shutil.copytree(step_folders(trained_run)[0], tmp_path / "step"))
    shutil.copy(Path(other_tokenizer_dir) / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(UserError, match=r"the tokenizer \(fingerprint \w+\) is not the one its model was "
                                        r"trained with \(\w+\); nothing was written$"):
        converter.convert(folder, tmp_path / "export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step"]


@pytest.mark.parametrize("planted", ["config.json", "tokenizer_config.json"])
def test_a_folders_own_code_never_runs_with_yes_on_stdin(planted, trained_run, tmp_path, monkeypatch, capsys):
    """A checkpoint naming code of its own (auto_map, a type transformers lacks) is refused in one line by
    every command that reads it, with "y" on stdin for transformers' question (`yes y | python ...`)."""
    folder, marker = tmp_path / "planted", tmp_path / "the folder's code ran"
    shutil.copytree(step_folders(trained_run)[0], folder)
    (folder / "payload.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    payload = {"model_type": "x", "tokenizer_class": "X", "auto_map": {"AutoConfig": "payload.X",
                                                                       "AutoTokenizer": [None, "payload.X"]}}
    (folder / planted).write_text(json.dumps(json.loads((folder / planted).read_text()) | payload))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 9))
    # compare_llama_cpp loads the folder once it has found llama_cpp and the GGUF file
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=None))
    (folder / "m.gguf").write_bytes(b"")
    for script, args in [(convert_to_hf, [folder, "hf"]), (convert_to_gguf, [folder, "m.gguf"]),
                         (compare_llama_cpp, [folder, folder / "m.gguf"]),
                         (eval_llm, ["--model_path", folder])]:
        with pytest.raises(SystemExit):
            run_cli(lambda: script.main(list(map(str, args))))  # noqa: B023  (called at once)
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "contains custom code" in line, script
    assert not marker.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["planted"]
