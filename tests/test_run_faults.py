"""Runs that go wrong in ways the trainer must recognise: a loss that blows up or collapses with finite
numbers, an update that leaves non-finite weights, a model or batch that does not fit, a folder it may not
write. Each ends in one line saying what is true and what to run next; nothing bad is saved."""

import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch

import eval_llm
import trainer.train_pretrain as tp
from common.cli import UserError, run_cli
from trainer.args import parse_args
from trainer.checkpoint import step_folders
from trainer.tracking import read_metrics

QUIET = ["--log_interval", 1, "--eval_interval", 4, "--eval_steps", 1, "--warmup_steps", 0]


@pytest.fixture
def flags(tmp_path, tiny_flags):
    """flags(*more, out=name): the tiny model's command line into tmp_path/name."""
    def make(*more, out: str = "run"):
        return [*tiny_flags, *map(str, QUIET), "--out_dir", str(tmp_path / out), *map(str, more)]
    return make


def refusal(argv) -> str:
    with pytest.raises(UserError) as err:
        tp.main(argv)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_loss_that_blows_up_with_finite_numbers_is_a_divergence_and_overwrite_starts_over(flags, tmp_path,
                                                                                             monkeypatch):
    """--learning_rate 50 without clipping: the loss climbs to thousands of nats, every number finite. It
    diverged before the first checkpoint, so the line says to start over with --overwrite, which works."""
    told = {}  # what the wandb side of the tracker is told

    class Recording(tp.Tracker):
        def __init__(self, out_dir, use_wandb, config, *more):
            told["config"] = config
            super().__init__(out_dir, use_wandb, config, *more)

        def close(self, failed=False):
            told.setdefault("failed", failed)  # the first close, the one that finishes the wandb run
            super().close(failed)

    monkeypatch.setattr(tp, "Tracker", Recording)
    argv = flags("--learning_rate", 50, "--grad_clip", 0, "--max_steps", 40, "--save_interval", 40)
    message = refusal(argv)
    # the wandb run is marked failed, and named by its variant though --variant was not given
    assert told["failed"] is True and told["config"]["variant"] == "pre-rmsnorm"
    # --resume finds the records and no checkpoint: the advice is --overwrite, not a circle
    assert refusal([*argv, "--resume"]).endswith("start afresh with --overwrite instead")
    assert "blew up" in message and "no checkpoint was saved: start over with --overwrite" in message
    assert "--resume" not in message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())  # what the ablation runner reads
    assert summary["diverged"] and "blew up" in summary["divergence"]
    assert summary["step"] < 40 and not step_folders(tmp_path / "run")  # nothing blown up was saved
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert all(math.isfinite(x) for x in losses) and max(losses) > 2 * math.log(400)
    summary = tp.train(parse_args([*argv, "--overwrite", "--learning_rate", "1e-3", "--max_steps", "4"]))
    assert not summary["diverged"] and summary["step"] == 4


def test_divergence_fires_on_neither_a_healthy_run_nor_its_first_steps(trained_run):
    """Replayed through the checks, every loss the shared 40-step run logged (its first step starts near ln V)
    is healthy; a validation loss far above ln V, or one no better than a unigram model's after the run had
    been better, is not. A training window far above ln V is only a spike: runs come back from those."""
    vocab_size = json.loads((trained_run / "step-000040" / "config.json").read_text())["vocab_size"]
    unigram = json.loads((trained_run / "summary.json").read_text())["unigram_loss"]
    uniform, lowest = math.log(vocab_size), math.inf
    start = uniform + 0.01  # about where a first step's loss is (measured in docs/training.md)
    records = read_metrics(trained_run / "metrics.jsonl")
    assert abs(records[0]["loss"] - uniform) < 0.5 and min(r["loss"] for r in records) < unigram - 0.05
    for r in records:
        assert tp.blown_up(r["loss"], start, vocab_size) is None
        if r["split"] == "val":
            assert tp.val_divergence(r["loss"], r["step"], start, lowest, unigram, vocab_size) is None
            lowest = min(lowest, r["loss"])
    assert "blew up" in tp.val_divergence(2.05 * uniform, 50, start, lowest, unigram, vocab_size)
    assert "more than 2x" in tp.blown_up(2.05 * uniform, start, vocab_size)  # a spike, when a train window
    assert "collapsed" in tp.val_divergence(unigram, 50, start, lowest, unigram, vocab_size)
    # the same value before the run was ever better is a plateau (the lr choice skips it), not a collapse
    assert tp.val_divergence(unigram, 1, start, math.inf, unigram, vocab_size) is None
    # a run that starts far above ln V (deepnorm without a norm) is measured from its own start
    assert tp.val_divergence(3000, 10, 3200, 3000, unigram, vocab_size) is None
    assert "its first loss (3200)" in tp.val_divergence(6500, 10, 3200, 3000, unigram, vocab_size)
    nan = tp.val_divergence(math.nan, 3, start, lowest, unigram, vocab_size)
    assert nan == "the validation loss was nan at step 3"


def test_a_training_spike_that_recovers_is_not_a_divergence(flags, capsys):
    """Each logged training window far above ln V is reported and the run goes on: evaluations decide."""
    summary = tp.train(parse_args(flags("--learning_rate", 2, "--max_steps", 8, "--eval_interval", 8)))
    spikes = [r for r in read_metrics(f"{summary['out_dir']}/metrics.jsonl")
              if r["split"] == "train" and r["loss"] > 2 * math.log(400)]
    assert spikes, "the tiny model at lr 2 spikes (docs/training.md)"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "the training loss spiked" in line]
    assert [line.split(" at step ")[1].split(",")[0] for line in warnings] == [str(r["step"]) for r in spikes]
    assert summary["step"] == 8  # it trained past the spike: only the evaluation at step 8 could stop it


def test_a_validation_loss_back_at_ln_v_after_learning_stops_the_run_unsaved(flags, monkeypatch, tmp_path):
    """The second evaluation returns exactly the uniform loss, no better than the unigram model's, as a
    collapsed model does: the first was better, so the run stops as diverged and keeps the first's step."""
    evaluate, calls = tp.evaluate, []

    def collapsing(*args, **kwargs):
        calls.append(1)
        return evaluate(*args, **kwargs) if len(calls) == 1 else math.log(400)
    monkeypatch.setattr(tp, "evaluate", collapsing)
    # by step 40 the tiny model is past the unigram loss (at step 20 it is not yet)
    summary = tp.train(parse_args(flags("--max_steps", 80, "--log_interval", 5, "--eval_interval", 40,
                                        "--save_interval", 40, "--learning_rate", 1e-2, "--warmup_steps", 5)))
    assert summary["diverged"] and summary["step"] == 80 and "collapsed to 5.9915" in summary["divergence"]
    assert [p.name for p in step_folders(tmp_path / "run")] == ["step-000040"]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["", "--overwrite"])
def test_an_update_that_made_weights_non_finite_is_never_saved(overwrite, flags, monkeypatch, tmp_path):
    """Step 4's update turns a weight into NaN from finite gradients; step 4 saves, unless checked."""
    calls, adamw_step = [], torch.optim.AdamW.step

    def poisoning_step(self, *args, **kwargs):
        adamw_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 4:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = math.nan
    monkeypatch.setattr(torch.optim.AdamW, "step", poisoning_step)
    argv = flags("--max_steps", 6, "--save_interval", 2)
    message = refusal([*argv, *overwrite])
    assert message.startswith("the loss or the weights became non-finite by step 4: lower --learning_rate, "
                              "raise --warmup_steps or lower --grad_clip; ")
    resume = "--resume in place of --overwrite" if overwrite else "--resume"  # the two exclude each other
    assert message.endswith(f"nothing after step-000002 was saved, and {resume} continues from it")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["diverged"] and summary["step"] == 4
    assert [p.name for p in step_folders(summary["out_dir"])] == ["step-000002"]

    monkeypatch.setattr(torch.optim.AdamW, "step", adamw_step)  # what the message says to run works
    assert not tp.train(parse_args([*argv, "--resume", "--learning_rate", "1e-3"]))["diverged"]


ALLOCATOR_ERRORS = {  # torch's own words when an allocation fails, on CUDA and on the CPU; and another error
    "cuda": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                                   "capacity of 79.19 GiB of which 3.12 GiB is free.\nOf the allocated ..."),
    "cpu": RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate "
                        "memory: you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate "
                        "memory)"),
    "not memory": RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x32 and 64x32)"),
}


@pytest.mark.parametrize("where", ["model", "first step"])
@pytest.mark.parametrize("error", ALLOCATOR_ERRORS)
def test_a_model_or_batch_that_does_not_fit_is_one_line(error, where, flags, monkeypatch, capsys):
    def allocation_fails(*args, **kwargs):
        raise ALLOCATOR_ERRORS[error]
    if where == "model":
        monkeypatch.setattr(tp, "MiniMindForCausalLM", allocation_fails)
    else:
        monkeypatch.setattr(tp.MiniMindForCausalLM, "forward", allocation_fails)
    capsys.readouterr()
    if error == "not memory":  # is not reported as one
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            run_cli(lambda: tp.main(flags("--max_steps", 2)))
        return
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: tp.main(flags("--max_steps", 2)))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2 and "--batch_size" in line
    assert line.startswith("error: the model or a training step does not fit in memory (")
    assert str(ALLOCATOR_ERRORS[error]).splitlines()[0] in line


def refuse_writes_below(folder: Path, err: int, monkeypatch) -> None:
    """The OS refusing to create anything below folder, as a read-only (EROFS) or foreign (EACCES) folder
    does: as root the test cannot make a folder unwritable for real."""
    mkdir = Path.mkdir

    def refusing(self, *args, **kwargs):
        if self == folder or folder in self.parents:
            raise OSError(err, os.strerror(err), str(self))
        return mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", refusing)


@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS], ids=["permission", "read-only"])
@pytest.mark.parametrize("command", ["trainer", "eval_llm"])
def test_an_unwritable_folder_is_one_line(command, err, flags, trained_run, tiny_corpus, tmp_path,
                                          monkeypatch, capsys):
    """Where the trainer writes its run, and where eval_llm caches the tokens of --eval_data."""
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))  # nothing tokenized there yet
    folder = tmp_path / ("run" if command == "trainer" else "cache")
    refuse_writes_below(folder, err, monkeypatch)
    main = (lambda: tp.main(flags("--max_steps", 2))) if command == "trainer" else (lambda: eval_llm.main(
        ["--device", "cpu", "--model_path", str(trained_run), "--eval_data", tiny_corpus]))
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(main)
    out, printed = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert printed.strip().splitlines()[-1] == f"error: cannot write {folder} ({os.strerror(err)})"
    assert "Traceback" not in printed and not folder.exists()
