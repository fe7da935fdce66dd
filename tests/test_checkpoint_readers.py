"""The tools that read a checkpoint (eval_llm.py, scripts/convert_to_hf.py, scripts/convert_to_gguf.py) check it
against its manifest and, pointed at a run directory, fall back to its newest intact checkpoint, saying so in one
line; a damaged folder named directly is one error line; a checkpoint a running trainer replaces while it is read
is read again. All in-process, on checkpoints saved by the trainer's own save_checkpoint."""

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import eval_llm
import trainer.run_dir
from common.cli import UserError, run_cli
from model import MiniMindForCausalLM
from scripts import convert_to_gguf, convert_to_hf
from tests.tiny import tiny_model
from trainer.run_dir import LINK, MANIFEST, READ_ATTEMPTS, read_model_dir, save_checkpoint


def save_step(out: Path, step: int, tokenizer, keep: int = 2) -> None:
    """A checkpoint as the trainer writes it (weights seeded by the step, so each step's differ)."""
    model = tiny_model(step, perturb=False, vocab_size=len(tokenizer))
    save_checkpoint(out, model, tokenizer, {"step": step}, keep=keep)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_tokenizer) -> Path:
    """A run directory with checkpoints at steps 2 and 4 (the link points to step-000004)."""
    out = tmp_path_factory.mktemp("readers") / "run"
    out.mkdir()
    for step in (2, 4):
        save_step(out, step, tiny_tokenizer)
    return out


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    return Path(shutil.copytree(base_run, tmp_path / "run", symlinks=True))


def has_weights_of(state: dict[str, torch.Tensor], step: int) -> bool:
    """Whether a state dict holds (a subset of) step's tensors unchanged."""
    vocab_size = state["model.embed_tokens.weight"].shape[0]
    expected = tiny_model(step, perturb=False, vocab_size=vocab_size).state_dict()
    return state.keys() <= expected.keys() and all(torch.equal(t, expected[k]) for k, t in state.items())


def flip_a_byte(file: Path) -> None:
    """Change one byte of the tensor data in place: the size stays, the file still loads, a weight is wrong."""
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF
    file.write_bytes(bytes(data))


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def break_the_link(run: Path) -> None:
    (run / LINK).unlink()
    (run / LINK).symlink_to("step-000009")


@pytest.mark.parametrize("damage, step, warning", [
    (lambda run: flip_a_byte(run / "step-000004" / "model.safetensors"), 2,
     "step-000004 is damaged (model.safetensors is corrupt"),
    (break_the_link, 4, f"{LINK} -> step-000009 does not exist"),
    (lambda run: (run / "step-000004" / MANIFEST).unlink(), 4, None),  # as older trainers saved: a note
], ids=["corrupt", "broken link", "no manifest"])
def test_a_run_directory_falls_back_to_its_newest_intact_checkpoint(damage, step, warning, run, capsys):
    damage(run)
    lm, _ = eval_llm.load(run)
    assert has_weights_of(lm.state_dict(), step)
    err = capsys.readouterr().err
    if warning is None:
        assert not warnings_in(err) and f"has no {MANIFEST}" in err
    else:
        (line,) = warnings_in(err)
        assert warning in line and f"using step-{step:06d}" in line


def test_a_corrupt_checkpoint_named_directly_is_one_error_line(run, capsys):
    flip_a_byte(run / "step-000004" / "model.safetensors")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: eval_llm.main(["--device", "cpu", "--model_path", str(run / LINK), "--prompt", "Hi"]))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and "model.safetensors is corrupt" in line
    assert f"pass the run directory {run}" in line


@pytest.mark.parametrize("converter", [convert_to_hf, convert_to_gguf], ids=["hf", "gguf"])
def test_converters_refuse_a_corrupt_checkpoint_and_export_the_intact_one(converter, run, tmp_path, capsys):
    flip_a_byte(run / "step-000004" / "model.safetensors")
    dst = tmp_path / "export.gguf" if converter is convert_to_gguf else tmp_path / "export"
    with pytest.raises(UserError, match="model.safetensors is corrupt"):
        converter.convert(run / "step-000004", dst)
    assert not dst.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    converter.convert(run, dst)  # the run directory: its newest intact checkpoint, with a warning
    assert "using step-000002" in warnings_in(capsys.readouterr().err)[0]
    if converter is convert_to_hf:  # the same module names: the export holds step 2's tensors unchanged
        assert has_weights_of(AutoModelForCausalLM.from_pretrained(dst).state_dict(), 2)


def test_a_run_with_no_intact_checkpoint_is_one_error_line(run):
    for step in (2, 4):
        flip_a_byte(run / f"step-{step:06d}" / "model.safetensors")
    with pytest.raises(UserError, match=r"no checkpoint can be loaded \(step-000004 is damaged .*step-000002 is "):
        eval_llm.load(run)
    for step in (2, 4):
        shutil.rmtree(run / f"step-{step:06d}")
    with pytest.raises(UserError, match=rf"no checkpoint can be loaded \({LINK} -> step-000004 does not exist\)"):
        eval_llm.load(run)


@pytest.mark.parametrize("deleted", ["wholly", "partly"])
def test_a_checkpoint_replaced_while_read_is_read_again(deleted, run, tiny_tokenizer, monkeypatch, capsys):
    """What a trainer saving every step with --keep_checkpoints 1 does to a reader: it saves a new step, flips
    the link and deletes the folder the reader resolved before the weights are read (wholly, or caught while
    deleting it). The reader must follow the link to the new checkpoint, not call the old one damaged."""
    real = AutoModelForCausalLM.from_pretrained
    saves = []

    def save_while_loading(model_dir, **kwargs):
        if not saves:  # once
            saves.append(6)
            save_step(run, 6, tiny_tokenizer, keep=1 if deleted == "wholly" else 3)
            if deleted == "partly":  # rmtree has removed the weights, not yet the folder
                (model_dir / "model.safetensors").unlink()
        return real(model_dir, **kwargs)

    monkeypatch.setattr(eval_llm.AutoModelForCausalLM, "from_pretrained", save_while_loading)
    lm, _ = eval_llm.load(run)
    assert has_weights_of(lm.state_dict(), 6) and (run / "step-000004").is_dir() == (deleted == "partly")
    err = capsys.readouterr().err
    assert "step-000004 was replaced by a newer checkpoint" in err and not warnings_in(err)


def test_reading_gives_up_after_a_few_replacements(run, tiny_tokenizer, capsys):
    steps = iter(range(6, 100, 2))

    def always_replaced(model_dir):
        save_step(run, next(steps), tiny_tokenizer, keep=1)
        return MiniMindForCausalLM.from_pretrained(model_dir)

    with pytest.raises(UserError, match=f"replaced {READ_ATTEMPTS} times while it was read"):
        read_model_dir(run, always_replaced)
    assert next(steps) == 6 + 2 * READ_ATTEMPTS


def test_damage_is_not_mistaken_for_a_replacement(run, monkeypatch):
    """A load that fails on a folder still there is damage (fall back), never a reason to read again."""
    calls = []
    monkeypatch.setattr(trainer.run_dir, "READ_ATTEMPTS", 1)

    def fails_on_step_4(model_dir):
        calls.append(model_dir.name)
        if model_dir.name == "step-000004":
            raise OSError("Unable to load weights")
        return model_dir.name

    assert read_model_dir(run, fails_on_step_4) == ((run / "step-000002").resolve(), "step-000002")
    assert calls == ["step-000004", "step-000002"]
