"""Runs that go wrong in ways the trainer must recognise: a loss that blows up or collapses with finite numbers,
flags that are not finite, an update that leaves non-finite weights. Each ends in one line saying what is true
and what to run next; nothing bad is saved."""

import json
import math
import os
import signal

import pytest
import torch

import trainer.train_pretrain as tp
from common.cli import UserError
from trainer.args import build_parser, final_lr, float_flags, parse_args
from trainer.run_dir import find_checkpoints
from trainer.tracking import read_metrics

QUIET = ["--log_interval", 1, "--eval_interval", 4, "--eval_steps", 1, "--warmup_steps", 0]


@pytest.fixture
def flags(tmp_path, monkeypatch, tiny_flags):
    """flags(*more, out=name): the tiny model's command line into tmp_path/name."""
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))

    def make(*more, out: str = "run"):
        return [*tiny_flags, *map(str, QUIET), "--out_dir", str(tmp_path / out), *map(str, more)]
    return make


def refusal(argv) -> str:
    with pytest.raises(UserError) as err:
        tp.main(argv)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_loss_that_blows_up_with_finite_numbers_is_a_divergence_and_overwrite_starts_over(flags, tmp_path):
    """--learning_rate 50 without clipping: the loss climbs to thousands of nats, every number finite. It
    diverged before the first checkpoint, so the line says to start over with --overwrite, which works."""
    argv = flags("--learning_rate", 50, "--grad_clip", 0, "--max_steps", 40, "--save_interval", 40)
    message = refusal(argv)
    assert "blew up" in message and "before the run saved any checkpoint" in message and "--overwrite" in message
    assert "is kept" not in message and "--resume" not in message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())  # what the ablation runner reads
    assert summary["diverged"] and "blew up" in summary["divergence"]
    assert summary["step"] < 40 and not find_checkpoints(tmp_path / "run")  # nothing blown up was saved
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert all(math.isfinite(x) for x in losses) and max(losses) > 2 * math.log(400)
    summary = tp.train(parse_args([*argv, "--overwrite", "--learning_rate", "1e-3", "--max_steps", "4"]))
    assert not summary["diverged"] and summary["step"] == 4


def test_divergence_fires_on_neither_a_healthy_run_nor_its_first_steps(trained_run):
    """Replayed through the checks, every loss the shared 40-step run logged (its first step starts near ln V) is
    healthy; a validation loss far above ln V, or one no better than a unigram model's after the run had been
    better, is not. A training window far above ln V is only a spike: runs come back from those."""
    vocab_size = json.loads((trained_run / "checkpoint" / "config.json").read_text())["vocab_size"]
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
    # the same value before the run was ever better is a plateau (a study's lr choice skips it), not a collapse
    assert tp.val_divergence(unigram, 1, start, math.inf, unigram, vocab_size) is None
    # a run that starts far above ln V (deepnorm without a norm) is measured from its own start
    assert tp.val_divergence(3000, 10, 3200, 3000, unigram, vocab_size) is None
    assert "its first loss (3200)" in tp.val_divergence(6500, 10, 3200, 3000, unigram, vocab_size)
    assert tp.val_divergence(math.nan, 3, start, lowest, unigram, vocab_size) == "the validation loss was nan at step 3"


def test_a_training_spike_that_recovers_is_not_a_divergence(flags, capsys):
    """A training window far above ln V is reported once and the run goes on; only evaluations decide."""
    summary = tp.train(parse_args(flags("--learning_rate", 2, "--max_steps", 8, "--eval_interval", 8)))
    spikes = [r for r in read_metrics(f"{summary['out_dir']}/metrics.jsonl")
              if r["split"] == "train" and r["loss"] > 2 * math.log(400)]
    assert spikes, "the tiny model at lr 2 spikes (docs/training.md)"
    assert capsys.readouterr().err.count("warning: the training loss spiked") == 1
    assert summary["step"] == 8  # it trained past the spike: only the evaluation at step 8 could stop it


def test_a_validation_loss_back_at_ln_v_after_learning_stops_the_run_unsaved(flags, monkeypatch, tmp_path):
    """The second evaluation returns exactly the uniform loss, as a collapsed model does: the run had learned (its
    train loss was > 1 nat below ln V), so it stops as diverged and keeps the checkpoint of the first."""
    evaluate, calls = tp.evaluate, []

    def collapsing(*args, **kwargs):
        calls.append(1)
        return evaluate(*args, **kwargs) if len(calls) == 1 else math.log(400)
    monkeypatch.setattr(tp, "evaluate", collapsing)
    summary = tp.train(parse_args(flags("--max_steps", 40, "--log_interval", 5, "--eval_interval", 20,
                                        "--save_interval", 20, "--learning_rate", 1e-2, "--warmup_steps", 5)))
    assert summary["diverged"] and summary["step"] == 40 and "collapsed to 5.9915" in summary["divergence"]
    assert [p.name for p in find_checkpoints(tmp_path / "run")] == ["step-000020"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("flag", float_flags(build_parser()))
def test_every_float_flag_must_be_finite(flag, value, tmp_path):
    with pytest.raises(UserError, match=f"^--{flag} must be a finite number, got"):
        parse_args(["--out_dir", str(tmp_path / "run"), f"--{flag}={value}"])


@pytest.mark.parametrize("more, message", [
    (["--learning_rate", 0], "--learning_rate must be > 0, got 0.0"),
    (["--dist_timeout", 0], "--dist_timeout must be > 0, got 0.0"),
    (["--seed", -1], "--seed must be in [0, 2**32 - 1], got -1"),
    (["--seed", 2**32], f"--seed must be in [0, 2**32 - 1], got {2**32}"),
    # the cosine schedule would climb from --learning_rate to --min_lr instead of decaying
    (["--learning_rate", "1e-3", "--min_lr", "0.5"], "the decay would end at 0.5, not in [0, --learning_rate "
     "0.001]; set --min_lr_ratio in [0, 1], or --min_lr at most --learning_rate"),
    (["--min_lr_ratio", "1.5"], "the decay would end at 0.009, not in [0, --learning_rate 0.006]; set "
     "--min_lr_ratio in [0, 1], or --min_lr at most --learning_rate"),
])
def test_a_bad_value_is_one_line_before_anything_is_written(more, message, flags, tmp_path):
    assert refusal(flags(*more)) == message
    assert not (tmp_path / "run").exists()


def test_the_decay_ends_at_a_fraction_of_the_peak_unless_min_lr_is_given(flags):
    assert final_lr(parse_args(flags("--learning_rate", "8e-3"))) == pytest.approx(8e-4)  # 10% of every peak
    assert final_lr(parse_args(flags("--learning_rate", "1e-3", "--min_lr_ratio", "0"))) == 0
    assert final_lr(parse_args(flags("--learning_rate", "1e-3", "--min_lr", "2e-4"))) == 2e-4  # the old studies


def test_muon_without_torch_optim_muon_is_refused(flags, monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    assert refusal(flags("--optimizer", "muon")).startswith("--optimizer muon needs torch.optim.Muon (torch 2.9 or "
                                                           "newer)")


def test_an_update_that_made_weights_non_finite_is_never_saved(flags, monkeypatch, tmp_path):
    """The update of step 4 turns a weight into NaN from finite gradients (as --learning_rate 1e38 can); the loss
    would show it only at step 5, but step 4 saves: the weights are checked first, and the run stops at step 3
    with the checkpoint of step 2."""
    calls, step_unless = [], tp.step_unless

    def poisoning_step(optimizer, skip):
        step_unless(optimizer, skip)
        calls.append(1)
        if len(calls) == 4:
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0].view(-1)[0] = math.nan
    monkeypatch.setattr(tp, "step_unless", poisoning_step)
    argv = flags("--max_steps", 6, "--save_interval", 2)
    message = refusal(argv)
    assert message.startswith("the loss, gradient or weights became non-finite at step 4;")
    assert "last checkpoint (step-000002) is kept" in message and "--resume" in message and "learning_rate" in message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["diverged"] and summary["step"] == 3
    assert [p.name for p in find_checkpoints(summary["out_dir"])] == ["step-000002"]

    monkeypatch.setattr(tp, "step_unless", step_unless)  # what the message says to run works
    assert not tp.train(parse_args([*argv, "--resume", "--learning_rate", "1e-3"]))["diverged"]


def test_the_first_record_after_a_stop_mid_window_is_that_of_the_uninterrupted_run(flags, monkeypatch, tmp_path):
    """SIGTERM at step 6 of a window of 4 (steps 5-8): the checkpoint carries the window's loss so far, and the
    resumed run's record at step 8 averages the same four losses, to the bit."""
    schedule = ("--log_interval", 4, "--eval_interval", 8, "--save_interval", 8, "--max_steps", 8)
    tp.train(parse_args(flags(*schedule, out="reference")))
    lr_at = tp.lr_at

    def interrupting(step, *rest):
        if step == 5:  # while step 6 runs
            os.kill(os.getpid(), signal.SIGTERM)
        return lr_at(step, *rest)
    monkeypatch.setattr(tp, "lr_at", interrupting)
    stopped = tp.train(parse_args(flags(*schedule)))
    assert stopped["interrupted"] and stopped["step"] == 6
    monkeypatch.setattr(tp, "lr_at", lr_at)
    tp.train(parse_args(flags(*schedule, "--resume")))

    def records(name):
        return [(r["step"], r["split"], r["loss"]) for r in read_metrics(tmp_path / name / "metrics.jsonl")]
    assert records("run") == records("reference") and len(records("run")) == 3


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "summary.json"])
def test_a_directory_where_the_trainer_keeps_a_file_is_one_line(name, flags, tmp_path):
    (tmp_path / "run" / name).mkdir(parents=True)
    with pytest.raises(UserError, match=f"{name} is a directory, where the trainer keeps its {name} file"):
        tp.train(parse_args(flags("--max_steps", 2)))
    assert [p.name for p in (tmp_path / "run").iterdir()] == [name]  # nothing written, nothing removed


def test_a_kill_during_the_first_save_leaves_advice_that_leads_somewhere(flags, tmp_path):
    """What SIGKILL during the first checkpoint leaves: the metrics logged so far and a half-written step folder
    under its hidden name, no checkpoint. --resume and a fresh run both point to --overwrite, which works."""
    out = tmp_path / "run"
    partial = out / ".step-000002.partial-12345"
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{")
    (out / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 6.0}\n')
    for extra in (["--resume"], []):
        with pytest.raises(UserError) as err:
            tp.train(parse_args(flags("--max_steps", 2, *extra)))
        assert "saved no checkpoint (metrics.jsonl)" in str(err.value) and "pass --overwrite" in str(err.value)
        assert "with --resume" not in str(err.value) and "without --resume" not in str(err.value)
    summary = tp.train(parse_args(flags("--max_steps", 2, "--overwrite")))
    assert summary["step"] == 2 and not partial.exists()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"] == [1, 2]
