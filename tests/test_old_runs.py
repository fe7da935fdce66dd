"""Runs and checkpoints written by older versions of the trainer (the compatibility section of trainer/run_dir.py):
a flag they did not record reads as the behaviour they had, and a checkpoint without the training-state fields,
data fingerprint and manifest added since still resumes, its data named by its flags."""

import shutil

import pytest
import torch

from common.cli import UserError
from trainer.args import parse_args
from trainer.run_dir import LINK, MANIFEST, STATE_FILE, STATE_KEYS, recorded_value
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

# What a checkpoint of an older trainer lacks: its training state held STATE_KEYS alone, and it had no manifest.
ADDED_SINCE = ("compile_time", "untimed_steps", "start_loss", "lowest_loss", "spiked", "window", "data")


def test_a_flag_missing_from_a_recorded_run_reads_as_the_behaviour_it_had():
    saved = {"grad_clip": 0.5, "log_interval": 7}
    assert recorded_value(saved, "grad_clip") == 0.5  # recorded: taken as is
    assert recorded_value(saved, "norm_weight_decay") is False  # not recorded: its default, the old behaviour
    assert recorded_value(saved, "diag_interval") == 7  # not recorded, and its default follows another flag
    # runs that did not record qk_norm and v_norm had them only with a HybridNorm placement
    assert recorded_value({"norm_position": "pre"}, "v_norm") == recorded_value({}, "qk_norm") == "none"
    assert recorded_value({"norm_position": "hybrid"}, "v_norm") == "head"


def test_an_old_checkpoint_resumes_and_its_data_is_named_by_its_flags(tmp_path, tiny_flags, tiny_corpus,
                                                                      monkeypatch, capsys):
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"

    def run(*flags, data_path=tiny_corpus):
        return train(parse_args([*tiny_flags, "--data_path", str(data_path), "--out_dir", str(out), "--log_interval",
                                 "1", "--eval_interval", "2", "--eval_steps", "1", "--save_interval", "2", *flags]))

    run("--max_steps", "2")
    state = torch.load(out / LINK / STATE_FILE, weights_only=False)
    assert set(state) - set(STATE_KEYS) == set(ADDED_SINCE)  # a field saved since needs a default for older ones
    torch.save({k: v for k, v in state.items() if k not in ADDED_SINCE}, out / LINK / STATE_FILE)
    (out / LINK / MANIFEST).unlink()

    same_data = shutil.copy(tiny_corpus, tmp_path / "copy.jsonl")  # without a fingerprint, another path is other data
    with pytest.raises(UserError, match="^--resume: the checkpoint was trained with --data_path .*, not .*copy.jsonl"):
        run("--max_steps", "4", "--resume", data_path=same_data)
    summary = run("--max_steps", "4", "--resume")
    assert summary["step"] == 4 and not summary["diverged"]
    assert f"has no {MANIFEST} (saved before manifests existed)" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"] == [1, 2, 3, 4]
    assert set(ADDED_SINCE) <= set(torch.load(out / LINK / STATE_FILE, weights_only=False))
