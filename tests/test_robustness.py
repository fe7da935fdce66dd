"""Faults on purpose: a run directory belongs to one run, checkpoints are verified and fall back, resume continues
the same run or refuses, and every other fault is one line with nothing lost. Everything runs in-process on a
tiny model, but for the timeouts of two trainer processes."""

import errno
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError

import data.token_stream
import eval_llm
import trainer.memory
import trainer.tracking
import trainer.train_pretrain
from common.cli import UserError, run_cli
from common.fs import exclusive_lock
from data import DEFAULT_TOKENIZER_DIR, load_texts, prepare_split
from model import MiniMindConfig, MiniMindForCausalLM
from scripts import run_ablation
from study.runner import run_name, run_one
from study.variants import VARIANTS
from trainer.args import parse_args
from trainer.memory import model_parameters, step_memory_bytes
from trainer.process import InterruptGuard
from trainer.run_dir import LINK, LOCK_FILE, read_model_dir
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

REPO = Path(__file__).resolve().parents[1]
# Added to the tiny model's flags: one schedule, whatever --max_steps, so resumed runs can be compared.
SCHEDULE = ["--eval_steps", "1", "--log_interval", "1", "--eval_interval", "2", "--save_interval", "2",
            "--warmup_steps", "1", "--learning_rate", "3e-3", "--lr_decay_steps", "8"]


@pytest.fixture(autouse=True)
def token_cache(tmp_path_factory, monkeypatch) -> None:
    """One private token cache for this module's runs, shared so each split is tokenized once."""
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path_factory.getbasetemp() / "robustness-cache"))


@pytest.fixture
def run(tiny_corpus, tiny_tokenizer_dir, tiny_model_flags):
    """run(out_dir, *flags): one in-process training run on the tiny corpus, tokenizer and model."""
    def go(out_dir, *flags, data_path=tiny_corpus, tokenizer_path=tiny_tokenizer_dir):
        source = [] if data_path is None else ["--data_path", str(data_path)]
        source += [] if tokenizer_path is None else ["--tokenizer_path", str(tokenizer_path)]
        return train(parse_args([*source, *tiny_model_flags, *SCHEDULE, "--out_dir", str(out_dir), *map(str, flags)]))
    return go


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_flags) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4; tests work on copies of it."""
    out = tmp_path_factory.mktemp("base") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIMIND_CACHE", str(tmp_path_factory.getbasetemp() / "robustness-cache"))
        train(parse_args([*tiny_flags, *SCHEDULE, "--out_dir", str(out), "--max_steps", "4"]))
    return out


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    return shutil.copytree(base_run, tmp_path / "run", symlinks=True)


def snapshot(directory: Path) -> dict:
    """Every file below directory (links as their targets) with its bytes; the lock file aside."""
    return {str(p.relative_to(directory)): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in sorted(directory.rglob("*")) if (p.is_symlink() or p.is_file()) and p.name != LOCK_FILE}


def train_losses(out_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out_dir / "metrics.jsonl") if r["split"] == "train"}


# --- one run per directory ------------------------------------------------------------------------


def test_fresh_run_into_a_used_directory_refuses_and_deletes_nothing(run_copy, run):
    before = snapshot(run_copy)
    with pytest.raises(UserError, match="holds another run") as refusal:
        run(run_copy, "--max_steps", 2)
    assert "--resume" in str(refusal.value) and "--overwrite" in str(refusal.value)
    assert snapshot(run_copy) == before

    run(run_copy, "--max_steps", 2, "--overwrite")  # on purpose: the old run goes, nothing of it stays mixed in
    assert sorted(train_losses(run_copy)) == [1, 2]
    assert sorted(p.name for p in run_copy.glob("step-*")) == ["step-000002"]
    assert json.loads((run_copy / "summary.json").read_text())["max_steps"] == 2
    with pytest.raises(UserError, match="--overwrite"):  # and the two contradict
        parse_args(["--out_dir", str(run_copy), "--resume", "--overwrite"])


def test_a_second_trainer_refuses_at_once_and_a_crashed_trainers_lock_is_stale(tmp_path, run):
    out = tmp_path / "run"
    out.mkdir()
    with exclusive_lock(out / LOCK_FILE), pytest.raises(UserError, match=f"in use by another trainer \\(pid {os.getpid()}\\)"):
        run(out, "--max_steps", 2)
    assert not (out / "metrics.jsonl").exists()
    (out / LOCK_FILE).write_text("999999999\n")  # what a killed trainer leaves: its pid, and no lock held
    run(out, "--max_steps", 2)
    with exclusive_lock(out / LOCK_FILE) as locked:  # and the finished run released it
        assert locked


@pytest.mark.parametrize("killed_trainers_lock", [False, True], ids=["new folder", "a killed trainer's lock"])
def test_a_failed_run_releases_its_lock_and_leaves_no_directory(killed_trainers_lock, tmp_path, run):
    out = tmp_path / "new" / "run"
    if killed_trainers_lock:  # all a trainer killed before its first write (out of memory, say) leaves
        out.mkdir(parents=True)
        (out / LOCK_FILE).write_text("999999999\n")
    with pytest.raises(UserError, match="no such file"):  # refused after the directory was claimed
        run(out, "--max_steps", 2, data_path=tmp_path / "missing.jsonl")
    assert not out.exists()


# --- checkpoints ----------------------------------------------------------------------------------


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "truncated weights": lambda step: truncate(step / "model.safetensors"),
    "truncated training state": lambda step: truncate(step / "training_state.pt"),
    "missing training state": lambda step: (step / "training_state.pt").unlink(),
    "corrupt config": lambda step: (step / "config.json").write_text("{not json"),
    "flipped weights": lambda step: (step / "model.safetensors").write_bytes(
        (step / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_falls_back_to_the_previous_checkpoint(damage, run_copy, base_run, run, capsys):
    DAMAGE[damage](run_copy / "step-000004")
    run(run_copy, "--max_steps", 6, "--resume")
    warning = [line for line in capsys.readouterr().err.splitlines() if "step-000004" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: checkpoint step-000004 cannot be loaded")
    # Steps 3 and 4 were trained again from step 2, exactly as the first time.
    losses = train_losses(run_copy)
    assert losses == pytest.approx({**train_losses(base_run), 5: losses[5], 6: losses[6]})
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert os.readlink(run_copy / LINK) == "step-000006"
    names = sorted(p.name for p in run_copy.glob("step-*"))  # rewritten; the damaged one is set aside, not deleted
    assert names[0] == "step-000004" and names[1].startswith("step-000004.damaged-") and names[2:] == ["step-000006"]


def test_resume_refuses_when_no_checkpoint_loads(run_copy, run):
    for step in run_copy.glob("step-*"):
        truncate(step / "model.safetensors")
    with pytest.raises(UserError, match="no checkpoint in .* can be loaded .*step-000004: .*step-000002: "):
        run(run_copy, "--max_steps", 6, "--resume")


def test_keep_checkpoints(tmp_path, run):
    out = tmp_path / "run"
    run(out, "--max_steps", 5, "--save_interval", 1, "--keep_checkpoints", 3)
    assert sorted(p.name for p in out.glob("step-*")) == ["step-000003", "step-000004", "step-000005"]


def test_what_crashed_saves_left_is_removed(run_copy, run):
    (run_copy / ".step-000006.partial-4242").mkdir()
    (run_copy / ".step-000006.partial-4242" / "model.safetensors").write_bytes(b"half")
    os.symlink("step-000006", run_copy / ".checkpoint.link-4242")
    (run_copy / "metrics.jsonl.x1y2.tmp").write_text("{")
    run(run_copy, "--max_steps", 6, "--resume")
    hidden_or_temporary = [p.name for p in run_copy.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert hidden_or_temporary == [LOCK_FILE]


@pytest.mark.parametrize("symlinks", [True, False], ids=["link-kept", "link-followed"])
def test_resume_from_a_copied_run_directory(symlinks, base_run, tmp_path, run):
    out = shutil.copytree(base_run, tmp_path / "elsewhere" / "copy", symlinks=symlinks)
    assert (out / LINK).is_symlink() == symlinks
    run(out, "--max_steps", 6, "--resume")
    assert sorted(train_losses(out)) == [1, 2, 3, 4, 5, 6]
    assert os.readlink(out / LINK) == "step-000006"
    # a reader gets the step folder itself, which later saves cannot flip under it
    assert read_model_dir(out, lambda d: None)[0] == (out / "step-000006").resolve()


# --- resume continues the same run ----------------------------------------------------------------


def test_same_data_under_another_spelling_resumes(tmp_path, run, tiny_corpus, monkeypatch):
    out = tmp_path / "run"
    run(out, "--max_steps", 2, tokenizer_path=None)  # the shipped tokenizer, by default
    monkeypatch.chdir(Path(tiny_corpus).parent)
    run(out, "--max_steps", 4, "--resume", data_path=Path(tiny_corpus).name, tokenizer_path=DEFAULT_TOKENIZER_DIR)
    assert sorted(train_losses(out)) == [1, 2, 3, 4]


def test_edited_data_or_another_tokenizer_refuses(run_copy, tmp_path, run, tiny_corpus, tiny_texts):
    edited = tmp_path / "tiny.jsonl"
    shutil.copy(tiny_corpus, edited)
    with pytest.raises(UserError, match="--tokenizer_path default is not the tokenizer"):
        run(run_copy, "--max_steps", 6, "--resume", tokenizer_path=None)
    run(run_copy, "--max_steps", 6, "--resume", data_path=edited)  # a copy of the same data is the same data
    with edited.open("a") as f:  # edited in place: same path, other documents
        f.write(json.dumps({"text": tiny_texts[1].upper()}) + "\n")
    with pytest.raises(UserError, match="the train split of --data_path .* is not the data the checkpoint was"):
        run(run_copy, "--max_steps", 8, "--resume", data_path=edited)


@pytest.mark.parametrize("flag,value", [("--norm", "layernorm"), ("--norm_position", "post"), ("--hidden_size", 64),
                                        ("--num_hidden_layers", 3), ("--qk_norm", "head"), ("--seed", 1)])
def test_architecture_and_seed_given_with_resume_must_match(flag, value, run_copy, run):
    with pytest.raises(UserError, match=f"{flag} "):
        run(run_copy, "--max_steps", 6, "--resume", flag, value)


def test_records_state_what_the_run_used(base_run):
    summary = json.loads((base_run / "summary.json").read_text())
    state = torch.load(base_run / LINK / "training_state.pt", weights_only=False)
    assert summary["hidden_size"] == 32 and summary["norm"] == summary["args"]["norm"] == "rmsnorm"
    assert summary["data"] == state["data"] and len(summary["data"]["train"]["sha256"]) == 64
    assert state["args"] == summary["args"]
    assert summary["environment"]["torch"] == torch.__version__ and summary["environment"]["device"]


def test_a_finished_run_says_so_and_keeps_its_summary(run_copy, run, capsys):
    before = snapshot(run_copy)
    summary = run(run_copy, "--max_steps", 4, "--resume")
    assert "already at step 4 of --max_steps 4" in capsys.readouterr().out
    assert snapshot(run_copy) == before and summary == json.loads((run_copy / "summary.json").read_text())

    (run_copy / "summary.json").unlink()  # killed after its last checkpoint, before the summary
    summary = run(run_copy, "--max_steps", 4, "--resume")
    assert summary["step"] == 4 and summary["val_loss"] == json.loads(before["summary.json"])["val_loss"]


GARBAGE = ['{"st\n', "42\n", '{"loss": 1.0}\n', "\udcff\udcfe binary\n"]


@pytest.mark.parametrize("spoil,warning", [
    (lambda lines: [*lines, '{"step": 5, "split": "tr'], "dropped a torn last line"),
    (lambda lines: lines[:2] + GARBAGE + lines[2:],
     "dropped 4 lines that are not metrics records (lines 3, 4, 5, 6)"),
], ids=["torn last line", "garbage lines"])
def test_bad_metrics_lines_are_dropped_with_a_warning_and_resume_goes_on(spoil, warning, run_copy, run,
                                                                           capsys):
    lines = (run_copy / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_copy / "metrics.jsonl").write_text("".join(spoil(lines)), errors="surrogateescape")
    run(run_copy, "--max_steps", 6, "--resume")
    assert warning in capsys.readouterr().err
    assert sorted(train_losses(run_copy)) == [1, 2, 3, 4, 5, 6]
    assert read_metrics(run_copy / "metrics.jsonl") and "dropped" not in capsys.readouterr().err  # rewritten clean


# --- every other fault: one line, nothing lost ----------------------------------------------------


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def safetensors_no_space(*args, **kwargs):  # what safetensors raises when the disk fills up under it
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("writer,fail", [("torch.save", no_space),  # the training state
                                         ("model.MiniMindForCausalLM.save_pretrained", safetensors_no_space)])
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(writer, fail, run_copy, run, monkeypatch):
    monkeypatch.setattr(writer, fail)
    with pytest.raises(UserError, match="cannot write the checkpoint for step 6 .*No space left on device") as err:
        run(run_copy, "--max_steps", 6, "--resume")
    assert "the previous checkpoint (step-000004) is kept" in str(err.value) and "\n" not in str(err.value)
    assert os.readlink(run_copy / LINK) == "step-000004"
    assert sorted(p.name for p in run_copy.iterdir() if "step-" in p.name) == ["step-000002", "step-000004"]
    with warnings.catch_warnings(record=True) as leaks:  # the failed run left no file open (the runner trains on)
        warnings.simplefilter("always", ResourceWarning)
        del err
        gc.collect()
    assert not [w for w in leaks if "metrics.jsonl" in str(w.message)]
    monkeypatch.undo()
    run(run_copy, "--max_steps", 6, "--resume")  # the kept checkpoint loads and the run goes on
    assert os.readlink(run_copy / LINK) == "step-000006"


def test_a_full_disk_when_writing_the_summary_is_one_line_and_resume_writes_it(tmp_path, run, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(trainer.train_pretrain, "write_file_atomically", no_space)
        with pytest.raises(UserError, match="cannot write .*summary.json \\(No space left on device\\); the checkpoint"):
            run(out, "--max_steps", 2)
    summary = run(out, "--max_steps", 2, "--resume")
    assert json.loads((out / "summary.json").read_text()) == summary and summary["val_loss"] is not None


def test_a_full_disk_while_logging_metrics_is_one_line(tmp_path):
    tracker = trainer.tracking.Tracker(tmp_path, False, {}, "p", "n", None, None)
    tracker.file.close()
    with open("/dev/full", "w") as tracker.file:  # Linux's full disk: every write that reaches it fails
        with pytest.raises(UserError, match="cannot write .*metrics.jsonl \\(No space left on device\\)"):
            tracker.log({"step": 1})
        assert tracker.file.closed  # so its unwritten buffer cannot fail once more at exit


def spoil_cache(packed, how: str) -> None:
    meta_path = packed.path.with_suffix(".json")
    if how == "zeroed":
        packed.path.write_bytes(bytes(packed.path.stat().st_size))
    elif how == "truncated":
        truncate(packed.path)
    elif how == "corrupt metadata":
        meta_path.write_text('{"num_tokens": ')
    elif how == "metadata of another key":
        meta = json.loads(meta_path.read_text())
        meta["key"]["split"] = "train"
        meta_path.write_text(json.dumps(meta))
    else:  # ids beyond the vocabulary, with a checksum to match: only the range check can tell
        tokens = np.array(packed.tokens)
        tokens[5] = 60000
        packed.path.write_bytes(tokens.tobytes())
        meta = json.loads(meta_path.read_text())
        meta["sha256"] = data.token_stream._scan(packed.path, tokens.dtype)[0]
        meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize("how", ["zeroed", "truncated", "corrupt metadata", "metadata of another key", "ids out of range"])
def test_a_damaged_token_cache_is_detected_and_rebuilt(how, tmp_path, tiny_corpus, tiny_tokenizer, capsys):
    packed = prepare_split(tiny_corpus, "validation", tiny_tokenizer, cache_dir=tmp_path)
    expected = np.array(packed.tokens)
    spoil_cache(packed, how)
    rebuilt = prepare_split(tiny_corpus, "validation", tiny_tokenizer, cache_dir=tmp_path)
    assert f"warning: token cache {packed.path} is damaged" in capsys.readouterr().err
    assert np.array_equal(rebuilt.tokens, expected) and rebuilt.sha256 == packed.sha256


def test_a_full_disk_while_tokenizing_is_one_line_and_leaves_no_temp_files(tmp_path, tiny_corpus, tiny_tokenizer,
                                                                            monkeypatch):
    def fills_the_disk(texts, tokenizer, dtype, out, *rest):
        out.write(b"the first tokens")
        no_space()

    monkeypatch.setattr(data.token_stream, "_pack", fills_the_disk)
    with pytest.raises(UserError, match=f"^cannot write the token cache in {tmp_path} \\(No space left on device\\)"):
        prepare_split(tiny_corpus, "validation", tiny_tokenizer, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["a file", "a path below a file"])
def test_a_token_cache_that_cannot_be_a_folder_is_one_line_in_the_trainer_and_eval_llm(where, base_run, tmp_path, run,
                                                                                      tiny_corpus, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = blocker if where == "a file" else blocker / "cache"
    monkeypatch.setenv("MINIMIND_CACHE", str(cache))
    expected = (f"MINIMIND_CACHE={cache} cannot hold the token cache ({blocker} is not a folder); point "
                "MINIMIND_CACHE at a folder this process can create or write, or unset it to use "
                "~/.cache/minimind-norm")
    with pytest.raises(UserError) as err:
        run(tmp_path / "run", "--max_steps", 2)
    assert str(err.value) == expected and not (tmp_path / "run").exists()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: eval_llm.main(["--model_path", str(base_run), "--eval_data", tiny_corpus]))
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"error: {expected}"]
    assert blocker.read_text() == "not a folder"


def test_non_string_text_names_file_and_record(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "first"}\n{"text": null}\n{"text": 12345}\n')
    with pytest.raises(UserError, match=f"^{path}:3: 'text' is 12345 \\(int\\), not a string$"):
        load_texts(str(path), "train")
    array = tmp_path / "docs.json"
    array.write_text(json.dumps([{"text": "a"}, {"text": ["b"]}]))
    with pytest.raises(UserError, match=f"^{array}:record 2: 'text' is \\['b'\\] \\(list\\), not a string$"):
        load_texts(str(array), "validation")


@pytest.mark.parametrize("flag,value,refusal", [
    ("--batch_size", 100000, r"--batch_size 100000 x --max_seq_len 32 needs at least [\d,]+\.\d GiB for one "
     r"training step, but cpu has 1\.0 GiB available; lower --batch_size \(and raise --accumulation_steps to keep "
     r"the tokens per step\)"),
    ("--hidden_size", 131072, r"--hidden_size 131072 x --num_hidden_layers 2 makes a model of [\d,]+ parameters, "
     r"whose weights, gradients and AdamW moments need [\d,]+\.\d GiB, but cpu has 1\.0 GiB available; lower "
     r"--hidden_size or --num_hidden_layers"),  # some 190 billion parameters in each block
], ids=["batch", "model"])
def test_what_cannot_fit_is_refused_before_allocation(flag, value, refusal, tmp_path, run, monkeypatch):
    monkeypatch.setattr(trainer.memory, "available_memory_bytes", lambda device: 2**30)
    with pytest.raises(UserError) as err:
        run(tmp_path / "run", flag, value)
    assert re.fullmatch(refusal, str(err.value)), err.value
    assert not (tmp_path / "run").exists()


def test_the_ablation_runner_refuses_a_depth_that_cannot_fit_and_leaves_no_run_folder(tmp_path, tiny_flags,
                                                                                     monkeypatch, capsys):
    monkeypatch.setattr(trainer.memory, "available_memory_bytes", lambda device: 2**30)
    study = tmp_path / "study"
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: run_ablation.main(["--out_dir", str(study), "--depths", "100000", *tiny_flags,
                                           "--max_steps", "2"]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --hidden_size 32 x --num_hidden_layers 100000 makes a model of ")
    assert not (study / "runs").exists()


@pytest.mark.parametrize("variant", ["pre-rmsnorm", "mix-layernorm", "hybrid_star-rmsnorm", "deepnorm-rmsnorm",
                                     "pre+gate-dyt", "peri+qkv-rmsnorm", "pre+embed_norm-layernorm"])
def test_the_parameter_count_of_a_config_is_exact_without_building_the_model(variant):
    for layers in (1, 3, 8):
        config = MiniMindConfig(vocab_size=400, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                num_key_value_heads=2, **VARIANTS[variant])
        assert model_parameters(config) == sum(p.numel() for p in MiniMindForCausalLM(config).parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_memory_estimate_is_a_lower_bound(dtype):
    """What autograd really keeps for one tiny step (plus the weights' training state) is at least the estimate,
    in fp32 and under bf16 autocast (fp32 residual stream and norms, 16-bit matmul inputs and logits)."""
    config = MiniMindConfig(vocab_size=400, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1)
    model = MiniMindForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def keep(t):
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, 400, (4, 64))
    autocast = torch.autocast("cpu", dtype, enabled=dtype != torch.float32)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast:
        model(input_ids=x, shift_labels=x)
    # alive until the loss is computed (and under autocast their fp32 copy); their log-softmax is among the saved
    logits = x.numel() * 400 * (4 if dtype == torch.float32 else 2 + 4)
    estimate = step_memory_bytes(config, num_params, 4, 64, dtype)
    assert 16 * num_params + sum(saved.values()) + logits >= estimate
    # and not far below it: the estimate counts at least 3/4 of what is kept
    assert 16 * num_params + sum(saved.values()) + logits < estimate * 4 / 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_tokenizing_is_one_line_and_leaves_no_temp_files(signum, tmp_path, run,
                                                                              monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINIMIND_CACHE", str(cache))

    def interrupted(texts, tokenizer, dtype, out, *rest):
        out.write(b"half a token file")
        os.kill(os.getpid(), signum)
        time.sleep(30)  # not reached: the handler raises as soon as os.kill returns

    monkeypatch.setattr(data.token_stream, "_pack", interrupted)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(UserError, match=f"^interrupted by {signal.Signals(signum).name}; nothing half-written"):
        run(tmp_path / "run", "--max_steps", 2)
    assert list(cache.iterdir()) == [] and not (tmp_path / "run").exists()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_an_interrupt_during_wandb_init_is_one_line_and_the_run_can_start_again(tmp_path, run, monkeypatch):
    def interrupted(*args):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # not reached

    with monkeypatch.context() as patch:
        patch.setattr(trainer.tracking.Tracker, "_init_wandb", staticmethod(interrupted))
        with pytest.raises(UserError, match="^interrupted by SIGINT"):
            run(tmp_path / "run", "--max_steps", 2, "--use_wandb")
    run(tmp_path / "run", "--max_steps", 2)  # nothing of a run was left, so a fresh start is no overwrite


def test_forked_workers_leave_ctrl_c_to_the_trainer_and_die_on_sigterm():
    guard = InterruptGuard()
    try:
        statuses = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            pid = os.fork()
            if pid == 0:  # a tokenizer worker: Ctrl-C reaches the whole process group
                os.kill(os.getpid(), signum)
                os._exit(0)
            statuses.append(os.waitpid(pid, 0)[1])
    finally:
        guard.restore()
    assert os.WIFEXITED(statuses[0]) and os.WEXITSTATUS(statuses[0]) == 0  # ignored it; the parent stops the pool
    assert os.WIFSIGNALED(statuses[1]) and os.WTERMSIG(statuses[1]) == signal.SIGTERM  # died quietly
    assert guard.signal is None


def test_a_too_short_validation_split_names_it_the_rule_and_the_flags(tmp_path, run, tiny_texts):
    corpus = tmp_path / "short.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["Hi.", *tiny_texts[:5]]))
    with pytest.raises(UserError) as err:
        run(tmp_path / "run", data_path=corpus)
    message = str(err.value)
    assert message.startswith(f"the validation split of --data_path {corpus} has ")
    assert "every 100th document" in message and "--max_seq_len" in message


def test_the_ablation_runner_starts_afresh_over_a_run_that_crashed_before_its_first_checkpoint(
        tmp_path, tiny_flags):
    study, base = run_ablation.parse_args(["--out_dir", str(tmp_path / "study"), *tiny_flags, *SCHEDULE,
                                           "--max_steps", "2"])
    config = ("pre-rmsnorm", 2, base.learning_rate, base.warmup_steps, 0)  # variant, depth, lr, warmup, seed
    crashed = tmp_path / "study" / "runs" / run_name(*config)
    crashed.mkdir(parents=True)
    (crashed / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 9.0}\n')
    summary = run_one(base, study, *config)
    assert summary["step"] == 2 and sorted(train_losses(crashed)) == [1, 2]
    assert train_losses(crashed)[1] != 9.0


# --- two processes: a rank that waits past --dist_timeout -------------------------------------------------

# One rank of a two-process gloo job, started as torchrun would (its environment variables), with one rank held up
# for 8 s, beyond the 3 s of --dist_timeout 0.05. The ranks meet before the trainer starts, so the seconds each
# spends importing do not count against the timeout of the process group's rendezvous.
RANK_PROBE = """
import os, sys, time
sys.path.insert(0, {repo!r})
import trainer.train_pretrain as tp
from common.cli import run_cli

rank, stall, meet = int(os.environ["RANK"]), {stall!r}, {meet!r}
if stall == "tokenizing" and rank == 0:  # rank 0 tokenizes the corpus while rank 1 waits for it
    prepare = tp.prepare_split
    tp.prepare_split = lambda p, split, *a, **k: (split == "train" and time.sleep(8)) or prepare(p, split, *a, **k)
if stall == "training" and rank == 1:  # rank 1 hangs before its share of the first evaluation
    evaluate = tp.evaluate
    tp.evaluate = lambda *args, **kwargs: time.sleep(8) or evaluate(*args, **kwargs)
open(os.path.join(meet, str(rank)), "w").close()
while len(os.listdir(meet)) < 2:
    time.sleep(0.05)
run_cli(lambda: tp.main(sys.argv[1:]))
"""
TIMED_OUT = ("error: rank {} waited 3 s for another rank (--dist_timeout 0.05 minutes) and gave up: that rank is "
             "still busy (local rank 0 tokenizes a corpus on its first use while the others wait) or hangs; raise "
             "--dist_timeout, or find what holds it up")
LOST = ("error: rank {} lost another rank, which exited (its own error line says why; a rank that waited past "
        "--dist_timeout exits too); fix what stopped it, or raise --dist_timeout")


@pytest.fixture(scope="module")
def stalled_jobs(tmp_path_factory, tiny_flags, tiny_tokenizer, tiny_corpus) -> dict[str, tuple]:
    """Both jobs at once (their ranks mostly sleep, so together they take the time of one), started as torchrun
    starts them: for each stall, its ranks, what each wrote to stderr, and the job's run folder."""
    cache = tmp_path_factory.mktemp("tokenized")
    for split in ("train", "validation"):
        prepare_split(tiny_corpus, split, tiny_tokenizer, cache_dir=cache)
    folders = {stall: tmp_path_factory.mktemp(stall) for stall in ("tokenizing", "training")}
    caches = {"tokenizing": folders["tokenizing"] / "cache", "training": cache}  # tokenized afresh, or already
    with socket.socket() as one, socket.socket() as other:  # two free ports, told apart while both are held
        one.bind(("127.0.0.1", 0))
        other.bind(("127.0.0.1", 0))
        ports = {"tokenizing": one.getsockname()[1], "training": other.getsockname()[1]}
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(MASTER_ADDR="127.0.0.1", WORLD_SIZE="2", OMP_NUM_THREADS="1")
    jobs = {}
    for stall, folder in folders.items():
        probe, meet = folder / "probe.py", folder / "meet"
        meet.mkdir()
        probe.write_text(RANK_PROBE.format(repo=str(REPO), stall=stall, meet=str(meet)))
        argv = [*tiny_flags, *SCHEDULE, "--out_dir", str(folder / "run"), "--max_steps", "4",
                "--dist_timeout", "0.05"]
        job_env = {**env, "MASTER_PORT": str(ports[stall]), "MINIMIND_CACHE": str(caches[stall])}
        jobs[stall] = [subprocess.Popen([sys.executable, str(probe), *argv], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env={**job_env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    try:
        errs = {stall: [process.communicate(timeout=120)[1] for process in ranks] for stall, ranks in jobs.items()}
    finally:
        for process in (p for ranks in jobs.values() for p in ranks):  # (one that hangs fails the test, and is
            process.kill()                                               # not left behind)
    return {stall: (jobs[stall], errs[stall], folders[stall] / "run") for stall in jobs}


@pytest.mark.slow  # two two-process jobs, one rank of each held up for 8 s
@pytest.mark.parametrize("stall,waits", [("tokenizing", 1), ("training", 0)])
def test_a_rank_that_waits_past_the_timeout_and_its_peer_each_end_in_one_line(stall, waits, stalled_jobs):
    ranks, errs, out = stalled_jobs[stall]
    for rank, (process, err) in enumerate(zip(ranks, errs, strict=True)):
        expected = (TIMED_OUT if rank == waits else LOST).format(rank)
        assert process.returncode == 2 and err.strip().splitlines()[-1] == expected, (rank, err[-3000:])
        assert "Traceback" not in err and "terminate called" not in err, (rank, err[-3000:])
    if stall == "tokenizing":  # rank 0 had claimed the run folder, and left nothing in it
        assert not out.exists()
    else:  # the steps before the evaluation were logged; nothing was saved, nothing is half-written
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, "metrics.jsonl"]
