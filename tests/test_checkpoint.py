"""trainer/checkpoint.py: one trainer per run folder, step-N checkpoints written whole or not at all, the
newest that loads read back (by --resume and by eval_llm), and a --resume that would not continue the same run
refused in one line. In-process on the tiny model, but for the kill -9 (a fresh process, slow)."""

import errno
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import eval_llm
import trainer.train_pretrain as tp
from common.cli import UserError
from data import DEFAULT_TOKENIZER_DIR
from model import MiniMindForCausalLM
from trainer import checkpoint
from trainer.args import build_parser, parse_args
from trainer.checkpoint import run_folder
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

REPO = Path(__file__).resolve().parents[1]
# Added to the tiny model's flags: one schedule whatever --max_steps, so that resumed runs can be compared.
SCHEDULE = ["--eval_steps", "1", "--log_interval", "1", "--eval_interval", "2", "--save_interval", "2",
            "--warmup_steps", "1", "--learning_rate", "3e-3", "--lr_decay_steps", "40"]


@pytest.fixture
def run(tiny_flags, tiny_flags_drawing_layers):
    """run(out_dir, *flags, draw=False): one in-process training run of the tiny model on the tiny corpus."""
    def go(out_dir, *flags, draw=False):  # draw: layers.png too, which the tiny flags skip
        return train(parse_args([*(tiny_flags_drawing_layers if draw else tiny_flags), *SCHEDULE,
                                 "--out_dir", str(out_dir), *map(str, flags)]))
    return go


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_flags) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4; tests work on copies of it."""
    out = tmp_path_factory.mktemp("base") / "run"
    train(parse_args([*tiny_flags, *SCHEDULE, "--out_dir", str(out), "--max_steps", "4"]))
    return out


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    return Path(shutil.copytree(base_run, tmp_path / "run"))


def snapshot(directory: Path) -> dict:
    """Every file below directory with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def train_losses(out_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out_dir / "metrics.jsonl") if r["split"] == "train"}


def steps(out_dir: Path) -> list[str]:
    return sorted(p.name for p in out_dir.iterdir() if "step-" in p.name)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_fresh_run_into_a_used_folder_refuses_and_overwrite_discards_only_the_runs_files(run_copy, run):
    (run_copy / "notes.txt").write_text("the user's own")
    before = snapshot(run_copy)
    with pytest.raises(UserError) as refusal:
        run(run_copy, "--max_steps", 2)
    message = str(refusal.value)
    assert "is not empty" in message and "--resume" in message and "--overwrite" in message
    assert "\n" not in message
    assert snapshot(run_copy) == before
    run(run_copy, "--max_steps", 2, "--overwrite")  # in the same process, as the ablation runner trains
    assert steps(run_copy) == ["step-000002"] and sorted(train_losses(run_copy)) == [1, 2]
    assert json.loads((run_copy / "summary.json").read_text())["max_steps"] == 2
    assert (run_copy / "notes.txt").read_text() == "the user's own"
    (run_copy / ".lock").unlink()  # no run of this trainer: its wandb/ and step folders are not ours
    kept = snapshot(run_copy)
    with pytest.raises(UserError, match=r"^--overwrite: .* is no run of this trainer \(no .lock that the"):
        run(run_copy, "--max_steps", 2, "--overwrite")
    assert snapshot(run_copy) == kept and not (run_copy / ".lock").exists()


def test_overwrite_deletes_only_what_the_run_wrote_and_only_once_it_can_start(run_copy, run, tmp_path):
    """Its own step folders and wandb run, not a user's step-2024/ or another run's wandb folder; and nothing
    at all when the new run cannot start (a mistyped --data_path)."""
    run_id = (run_copy / ".lock").read_text().split()[-1]
    wandb = run_copy / "wandb"
    ours, theirs = (wandb / f"offline-run-20260101_120000-{name}" for name in (run_id, "their0run"))
    for folder in (ours, theirs):
        (folder / "files").mkdir(parents=True)
        (folder / "files" / "config.yaml").write_text(folder.name)
    (run_copy / "step-2024").mkdir()
    (run_copy / "step-2024" / "notes.txt").write_text("the user's")
    before = snapshot(run_copy)
    with pytest.raises(UserError, match="typo.jsonl: no such file"):
        run(run_copy, "--max_steps", 2, "--overwrite", "--data_path", tmp_path / "typo.jsonl")
    assert snapshot(run_copy) == before
    run(run_copy, "--max_steps", 2, "--overwrite")
    assert steps(run_copy) == ["step-000002", "step-2024"] and sorted(train_losses(run_copy)) == [1, 2]
    assert (run_copy / "step-2024" / "notes.txt").read_text() == "the user's"
    assert [p.name for p in wandb.iterdir()] == [theirs.name] and snapshot(theirs) == {
        "files/config.yaml": theirs.name.encode()}
    assert (run_copy / ".lock").read_text().split()[-1] != run_id  # a new run, a new id


def test_an_earlier_versions_run_folder_is_the_trainers_by_its_training_state(run_copy, run):
    """Before .lock held an id, the trainer left it empty: such a folder is the trainer's when its step
    folders hold the trainer's training state, and --overwrite starts over in it."""
    (run_copy / ".lock").write_text("")
    run(run_copy, "--max_steps", 2, "--overwrite")
    assert steps(run_copy) == ["step-000002"]
    assert (run_copy / ".lock").read_text().startswith("minimind-norm trainer run ")
    (run_copy / ".lock").write_text("")
    (run_copy / "step-000002" / "training_state.pt").unlink()  # nothing of the trainer's left
    with pytest.raises(UserError, match=r"^--overwrite: .* is no run of this trainer"):
        run(run_copy, "--max_steps", 2, "--overwrite")


def test_a_lock_another_tool_wrote_or_a_link_is_not_the_trainers(tmp_path, run):
    """A folder holding another tool's .lock loses nothing to --overwrite; a .lock that is a dangling link is
    never followed out of the folder."""
    theirs = tmp_path / "theirs"
    for name in (".lock", "metrics.jsonl", "summary.json", "wandb/run-1/log", "step-000002/notes"):
        (theirs / name).parent.mkdir(parents=True, exist_ok=True)
        (theirs / name).write_text("another tool's")
    before = snapshot(theirs)
    with pytest.raises(UserError, match=r"^--overwrite: .* is no run of this trainer"):
        run(theirs, "--max_steps", 2, "--overwrite")
    assert snapshot(theirs) == before
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".lock").symlink_to(tmp_path / "outside")
    with pytest.raises(UserError, match=r"\.lock is a link, not the trainer's lock file"):
        run(linked, "--max_steps", 2)
    assert not (tmp_path / "outside").exists() and [p.name for p in linked.iterdir()] == [".lock"]


def test_a_second_trainer_on_a_held_folder_is_refused(tmp_path, run):
    out = tmp_path / "run"
    held = checkpoint.claim(out, resume=False, overwrite=False)  # another open file: another trainer's flock
    try:
        with pytest.raises(UserError, match="is in use by another trainer"):
            run(out, "--max_steps", 2)
    finally:
        os.close(held)
    assert [p.name for p in out.iterdir()] == [".lock"]
    assert run(out, "--max_steps", 2)["step"] == 2  # released with its holder


def test_resume_without_a_checkpoint_is_one_line_and_its_advice_works(tmp_path, run):
    with pytest.raises(UserError) as refusal:
        run(tmp_path / "run", "--max_steps", 2, "--resume")
    assert "no checkpoint in" in str(refusal.value) and "without --resume" in str(refusal.value)
    assert run(tmp_path / "run", "--max_steps", 2)["step"] == 2
    # a folder of other files, no run of the trainer: --overwrite would refuse it, so not that advice
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("train")
    with pytest.raises(UserError, match="no checkpoint in .*notes; start afresh in a new --out_dir$"):
        run(tmp_path / "notes", "--max_steps", 2, "--resume")


def test_resume_falls_back_to_the_step_before_a_damaged_one_or_refuses_when_none_loads(run_copy, base_run,
                                                                                        run, capsys):
    truncate(run_copy / "step-000004" / "model.safetensors")
    shutil.copytree(run_copy / "step-000004", run_copy / "step-000008")  # as if a newer version's
    capsys.readouterr()
    run(run_copy, "--max_steps", 6, "--resume")
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning:") and "--resume changes --max_steps" not in line]
    assert len(warnings) == 3 and f"{run_copy / 'step-000004'} cannot be loaded" in warnings[1]
    assert "step-000004 did not load on --resume (another version's, or damaged); kept as" in warnings[2]
    losses = train_losses(run_copy)  # steps 3 and 4 trained again from step 2, exactly as the first time
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert {k: losses[k] for k in range(1, 5)} == train_losses(base_run)
    damaged = [name for name in steps(run_copy) if "-not-loaded-" in name]  # kept, not replaced
    assert steps(run_copy) == ["step-000004", *damaged, "step-000006", "step-000008"] and len(damaged) == 1
    assert same_weights(run_copy / "step-000004", base_run / "step-000004")
    for folder in run_copy.glob("step-*"):
        truncate(folder / "model.safetensors")
    with pytest.raises(UserError, match=r": no checkpoint loads \(step-000008: .*; step-000004: ") as refusal:
        run(run_copy, "--max_steps", 8, "--resume")
    assert "\n" not in str(refusal.value)


def test_a_step_resume_could_not_load_is_kept_beside_the_step_saved_in_its_place(run_copy, base_run, run,
                                                                                   capsys):
    """Another version's step-000006 (here: one whose weights do not load) is neither loaded nor replaced."""
    shutil.copytree(run_copy / "step-000004", run_copy / "step-000006")
    truncate(run_copy / "step-000006" / "model.safetensors")
    theirs = snapshot(run_copy / "step-000006")
    capsys.readouterr()
    run(run_copy, "--max_steps", 6, "--resume")
    (kept,) = run_copy.glob("step-000006-not-loaded-*")
    assert snapshot(kept) == theirs and same_weights(run_copy / "step-000004", base_run / "step-000004")
    assert eval_llm.load(run_copy)[0] is not None  # the step saved in its place loads
    warning = [line for line in capsys.readouterr().err.splitlines() if "did not load on --resume" in line]
    assert warning == [f"warning: {run_copy / 'step-000006'} did not load on --resume (another version's, or "
                       f"damaged); kept as {kept.name}, and this run's step 6 saved in its place"]


def test_a_damaged_training_state_falls_back_to_the_step_before(run_copy, base_run, run, capsys):
    """Random bytes in the newest training_state.pt: the step before resumes, and the damaged step is kept."""
    damaged = os.urandom(4096)
    (run_copy / "step-000004" / checkpoint.STATE_FILE).write_bytes(damaged)
    capsys.readouterr()
    run(run_copy, "--max_steps", 4, "--resume")
    assert (f"warning: {run_copy / 'step-000004'} cannot be loaded (training_state.pt is damaged (not the "
            "archive torch.save writes)); trying the one before") in capsys.readouterr().err
    assert train_losses(run_copy) == train_losses(base_run)  # steps 3 and 4 trained again, alike
    assert same_weights(run_copy / "step-000004", base_run / "step-000004")
    (kept,) = run_copy.glob("step-000004-not-loaded-*")
    assert (kept / checkpoint.STATE_FILE).read_bytes() == damaged


def test_a_step_is_saved_only_once_it_evaluates_sane(trained_run, tiny_flags, tmp_path):
    """Resumed at step 40 with an absurd lr, step 41's update leaves finite weights near 1e30 and its training
    loss (computed before the update) finite: unevaluated, it was saved and became the step --resume continues
    from. Evaluated first, it shows the run collapsed, is not saved, and the line names step 40."""
    out = Path(shutil.copytree(trained_run, tmp_path / "run"))
    kept = snapshot(out / "step-000040")
    with pytest.raises(UserError) as err:
        tp.main([*tiny_flags, "--out_dir", str(out), "--resume", "--max_steps", "50",
                 "--learning_rate", "1e30", "--save_interval", "41", "--eval_interval", "50"])
    assert "collapsed to 5.9915 at step 41" in str(err.value)
    assert str(err.value).endswith("nothing after step-000040 was saved, and --resume continues from it")
    assert steps(out) == ["step-000040"] and snapshot(out / "step-000040") == kept


# A full disk as the OS reports it, and as torch.save and safetensors do (measured on a full tmpfs)
FULL_DISK = {"OSError": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
             "torch": RuntimeError("basic_ios::clear: iostream error"),
             "safetensors": SafetensorError("Error while serializing: I/O error: No space left on device (os "
                                            "error 28)")}


@pytest.mark.parametrize("error", FULL_DISK)
@pytest.mark.parametrize("writer", [(torch, "save"), (MiniMindForCausalLM, "save_pretrained")],
                         ids=["training state", "weights"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_step(writer, error, run_copy, run,
                                                                          monkeypatch):
    def crash_after_writing(*args, **kwargs):
        real(*args, **kwargs)
        raise FULL_DISK[error]

    kept = snapshot(run_copy / "step-000004")
    with monkeypatch.context() as patch:
        real = getattr(*writer)
        patch.setattr(*writer, crash_after_writing)
        if error == "torch":  # its words say nothing of space: the disk it filled does
            patch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=0))
        with pytest.raises(UserError, match="^out of disk space in .*: step-000006 was not saved, the"):
            run(run_copy, "--max_steps", 6, "--resume")
    assert steps(run_copy) == ["step-000002", "step-000004"] and snapshot(run_copy / "step-000004") == kept
    assert not [p for p in run_copy.iterdir() if p.name.startswith(".step") or p.suffix == ".tmp"]
    assert run(run_copy, "--max_steps", 6, "--resume")["step"] == 6  # the kept step resumes


def test_a_full_disk_at_the_first_save_advises_what_works(tmp_path, run, monkeypatch):
    """With no step before it there is nothing to --resume: the line says to start again with --overwrite."""
    def disk_full(*args):
        raise FULL_DISK["OSError"]

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", disk_full)
        with pytest.raises(UserError, match=r"step-000002 was not saved, nor any step before it; free some "
                                            r"space, then start again with --overwrite$"):
            run(tmp_path / "run", "--max_steps", 2)
    assert run(tmp_path / "run", "--max_steps", 2, "--overwrite")["step"] == 2


def test_a_step_is_on_disk_before_an_older_one_is_pruned(tmp_path, monkeypatch):
    done = []
    monkeypatch.setattr(checkpoint, "fsync", lambda path: done.append(f"fsync {path.name}"))
    monkeypatch.setattr(checkpoint, "remove", lambda path: done.append(f"remove {path.name}"))
    (tmp_path / "step-000001").mkdir()
    checkpoint.save(tmp_path, 2, lambda folder: (folder / "weights").write_text("w"), keep=1)
    assert done == ["fsync weights", "fsync .step-000002.tmp", "fsync " + tmp_path.name,
                    "remove .step-000001.tmp", "remove .step-000001.tmp"]  # (a leftover first, then it)


def test_a_kill_while_pruning_leaves_no_partial_step(tmp_path, monkeypatch):
    """Deleting a step's files one by one under its name, a kill -9 midway left a step-N folder without
    its weights or tokenizer, which eval_llm then read by name."""
    for step in (1, 2):
        checkpoint.save(tmp_path, step, lambda folder: [(folder / name).write_text(name) for name in "abc"],
                        keep=2)
    rmtree = shutil.rmtree

    def killed_midway(path, *args, **kwargs):
        next(Path(path).iterdir()).unlink()
        raise KeyboardInterrupt  # (as far as the folder can tell, a kill)
    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 3, lambda folder: (folder / "a").write_text("a"), keep=2)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert sorted(p.name for p in checkpoint.step_folders(tmp_path)) == ["step-000002", "step-000003"]
    assert sorted(p.name for p in (tmp_path / "step-000002").iterdir()) == ["a", "b", "c"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [".step-000001.tmp"]


def test_overwrite_clears_what_a_killed_save_left(tmp_path, run):
    run(tmp_path / "run", "--max_steps", 2)
    (tmp_path / "run" / ".step-000007.tmp").mkdir()  # a save killed at a step no later save repeats
    run(tmp_path / "run", "--max_steps", 2, "--overwrite")
    assert not (tmp_path / "run" / ".step-000007.tmp").exists()


@pytest.mark.parametrize("keep", [1, 3])
def test_keep_checkpoints(keep, tmp_path, run):
    run(tmp_path / "run", "--max_steps", 5, "--save_interval", 1, "--keep_checkpoints", keep)
    assert steps(tmp_path / "run") == [f"step-{s:06d}" for s in range(6 - keep, 6)]


@pytest.fixture
def edited_corpus(tmp_path, tiny_corpus, tiny_texts) -> Path:
    """The tiny corpus under another name with one document more: other training data."""
    path = tmp_path / "edited.jsonl"
    path.write_text(Path(tiny_corpus).read_text() + json.dumps({"text": tiny_texts[1].upper()}) + "\n")
    return path


@pytest.mark.parametrize("flags, refusal", [
    (["--data_path", "EDITED"], "--resume: the train split is not the checkpoint's (trained with "
                                "--data_path CORPUS --tokenizer_path TOKENIZER); pass those flags"),
    (["--tokenizer_path", DEFAULT_TOKENIZER_DIR], "--resume: the tokenizer is not the checkpoint's (trained"),
    (["--batch_size", "2"], "--resume: the checkpoint was trained with --batch_size 4, not 2; pass the same"),
    (["--seed", "1"], "--resume: the checkpoint was trained with --seed 0, not 1; pass the same,"),
    (["--norm", "layernorm"], "--resume: the checkpoint's model has --norm rmsnorm, not layernorm; pass"),
    (["--num_hidden_layers", "3"], "--resume: the checkpoint's model has --num_hidden_layers 2, not 3; pass"),
    (["--max_steps", "2"], "--resume: the checkpoint is at step 4, past --max_steps 2; pass a larger"),
    # on/off flags take no value: the message must not offer "--sub_norm False"
    (["--norm_weight_decay"], "--resume: the checkpoint was trained with no --norm_weight_decay, not with"),
    (["--sub_norm"], "--resume: the checkpoint's model has no --sub_norm, not with it; pass the same"),
], ids=["data", "tokenizer", "must-match flag", "seed", "norm", "depth", "max steps", "on/off flag",
        "on/off switch"])
def test_resume_refuses_what_would_not_continue_the_same_run(flags, refusal, run_copy, run, edited_corpus,
                                                             tiny_corpus, tiny_tokenizer_dir):
    before = snapshot(run_copy)
    with pytest.raises(UserError) as err:
        run(run_copy, "--max_steps", 6, "--resume", *[edited_corpus if f == "EDITED" else f for f in flags])
    refusal = refusal.replace("CORPUS", tiny_corpus).replace("TOKENIZER", tiny_tokenizer_dir)
    assert str(err.value).startswith(refusal) and "\n" not in str(err.value)
    assert snapshot(run_copy) == before


def test_a_run_on_the_default_data_is_told_to_leave_the_data_flags_out(run_copy, run, edited_corpus):
    """With no data flag to name, the advice is not "pass those flags"."""
    for folder in checkpoint.step_folders(run_copy):  # as if trained on the default data and tokenizer
        state = torch.load(folder / checkpoint.STATE_FILE, weights_only=False)
        state["args"] |= {"data_path": None, "tokenizer_path": build_parser().get_default("tokenizer_path")}
        torch.save(state, folder / checkpoint.STATE_FILE)
    with pytest.raises(UserError, match=r"\(trained with the default data\); leave the data flags out, with"):
        run(run_copy, "--max_steps", 6, "--resume", "--data_path", edited_corpus)


def test_the_same_data_under_another_name_resumes(run_copy, run, tiny_corpus, tmp_path, monkeypatch):
    shutil.copy(tiny_corpus, tmp_path / "copy.jsonl")  # compared by its tokens, not by its path
    monkeypatch.chdir(tmp_path)
    assert run(run_copy, "--max_steps", 6, "--resume", "--data_path", "copy.jsonl")["step"] == 6


def test_resume_names_a_derived_switch_as_not_given(tmp_path, run):
    """DeepNorm's scales are derived from the depth unless given: the checkpoint holds none to pass."""
    run(tmp_path / "run", "--max_steps", 2, "--norm_position", "deepnorm")
    with pytest.raises(UserError, match=r"model has no --deepnorm_alpha \(derived\), not 2.0; pass the same"):
        run(tmp_path / "run", "--max_steps", 4, "--resume", "--norm_position", "deepnorm",
            "--deepnorm_alpha", 2)


def test_resume_compares_the_resolved_flags_so_the_same_command_continues(tmp_path, run):
    """'the same command with --resume' continues; a shorter one resolves to another model."""
    run(tmp_path / "run", "--max_steps", 2, "--norm", "layernorm", "--qk_norm", "head")
    with pytest.raises(UserError, match="the checkpoint's model has --norm layernorm, not rmsnorm"):
        run(tmp_path / "run", "--max_steps", 4, "--resume")
    summary = run(tmp_path / "run", "--max_steps", 4, "--resume", "--norm", "layernorm", "--qk_norm", "head")
    assert summary["step"] == 4 and summary["variant"] == "pre+qk_head-layernorm"


def test_a_resume_that_changes_the_schedule_says_so(run_copy, run, capsys):
    """Allowed, to train further; but a flag left out of the command takes its default, not the run's."""
    capsys.readouterr()
    run(run_copy, "--max_steps", 6, "--resume", "--learning_rate", "1e-3")
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: --resume changes --max_steps 6 (was 4), --learning_rate 0.001 (was 0.003); "
                        "to continue the run as it was, repeat its flags"]


class Planted:
    """What a crafted training_state.pt holds: unpickling it calls a function, here one that writes a file."""
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.write_text, (self.marker, "the pickle ran code")


def test_a_training_state_whose_pickle_would_run_code_is_refused_and_never_runs(tmp_path, run):
    """As is an older version's state: the refusal says what reads it and how to train on."""
    out, marker = tmp_path / "run", tmp_path / "marker"
    run(out, "--max_steps", 2)
    state = out / "step-000002" / checkpoint.STATE_FILE
    torch.save({**torch.load(state, weights_only=True), "sampler": [Planted(marker)]}, state)
    with pytest.raises(UserError, match=r"does not read \(an older version's, or one that would run code\); "
                                        r"eval_llm.py reads its weights, and a new --out_dir"):
        run(out, "--max_steps", 4, "--resume")
    assert not marker.exists()
    assert eval_llm.load(out)[0] is not None and not marker.exists()  # its weights are read
    torch.load(state, weights_only=False)  # the check has teeth: an unrestricted load runs it
    assert marker.read_text() == "the pickle ran code"


def test_a_link_planted_in_a_run_folder_is_replaced_and_its_target_untouched(run_copy, run, tmp_path):
    targets = {name: tmp_path / f"victim-{name}" for name in ("layers.png", "summary.json", "metrics.jsonl")}
    for name, target in targets.items():
        if name != "metrics.jsonl":  # left dangling
            target.write_text("someone else's file")
        (run_copy / name).unlink(missing_ok=True)
        (run_copy / name).symlink_to(target)
    run(run_copy, "--max_steps", 6, "--resume", draw=True)
    for name, target in targets.items():
        assert not (run_copy / name).is_symlink() and (run_copy / name).stat().st_size > 0, name
        assert not target.exists() if name == "metrics.jsonl" else target.read_text() == "someone else's file"
    assert json.loads((run_copy / "summary.json").read_text())["step"] == 6


def test_eval_llm_reads_a_run_folders_newest_step_that_loads(run_copy, capsys):
    def weights_equal(lm, folder):
        saved = load_file(folder / "model.safetensors")
        return all(torch.equal(t, saved[k]) for k, t in lm.state_dict().items() if k in saved)

    assert weights_equal(eval_llm.load(run_copy)[0], run_copy / "step-000004")
    assert eval_llm.display_name(run_copy / "step-000004") == eval_llm.display_name(run_copy) == "run"
    assert not weights_equal(eval_llm.load(run_copy)[0], run_copy / "step-000002")  # the steps differ
    truncate(run_copy / "step-000004" / "model.safetensors")
    capsys.readouterr()
    assert weights_equal(eval_llm.load(run_copy)[0], run_copy / "step-000002")
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith(f"warning: {run_copy / 'step-000004'} cannot be loaded")


@pytest.mark.slow  # a trainer in a fresh process, killed outright, and two runs to compare
def test_a_kill_9_loses_no_finished_step_and_resume_ends_where_an_uninterrupted_run_ends(tmp_path, run,
                                                                                          tiny_flags):
    killed = tmp_path / "killed"
    argv = [*tiny_flags, *SCHEDULE, "--eval_interval", "1000", "--out_dir", str(killed)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    process = subprocess.Popen([sys.executable, str(REPO / "trainer" / "train_pretrain.py"), *argv,
                                "--max_steps", "100000"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (killed / "step-000006").exists():
        assert process.poll() is None and time.time() < deadline, process.stderr.read()[-2000:]
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)  # no handler, no cleanup: mid-step, or mid-save
    assert process.wait(timeout=60) == -signal.SIGKILL
    newest = checkpoint.step_folders(killed)[0]
    end = int(newest.name.removeprefix("step-")) + 4
    trained = train_losses(killed)
    assert max(trained) >= end - 4  # every step it finished was logged, up to its newest checkpoint
    run(killed, "--eval_interval", 1000, "--max_steps", end, "--resume")
    run(tmp_path / "straight", "--eval_interval", 1000, "--max_steps", end)
    assert train_losses(killed) == train_losses(tmp_path / "straight") and len(train_losses(killed)) == end
    assert same_weights(killed / f"step-{end:06d}", tmp_path / "straight" / f"step-{end:06d}")


def test_a_run_folder_is_a_step_folders_parent_and_any_other_folder_itself(tmp_path, monkeypatch):
    assert run_folder(tmp_path / "run" / "step-000040") == tmp_path / "run"
    assert run_folder(tmp_path / "step-warmup") == tmp_path / "step-warmup"  # a user's --out_dir
    monkeypatch.chdir(tmp_path)
    assert run_folder("run/step-000040/..") == tmp_path / "run"  # a name, not ".."


@pytest.mark.parametrize("inside", ["a", "runs/a"])  # runs in `out`; a study's, in its runs/
def test_the_folder_the_runs_are_in_is_refused_naming_them(inside, tmp_path, run):
    out = tmp_path / "out"
    (out / inside / "step-000002").mkdir(parents=True)
    for flags in ([], ["--resume"]):
        with pytest.raises(UserError, match=re.escape(f"--out_dir {out} holds runs ({out / inside}); "
                                                      "pass one of them with --resume")):
            run(out, "--max_steps", 2, *flags)
    with pytest.raises(UserError, match=re.escape(f"{out}: holds runs, not a checkpoint; "
                                                  f"pass one of them ({out / inside})")):
        eval_llm.load(out)
