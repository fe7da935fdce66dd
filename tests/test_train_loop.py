"""The training loop in-process: where the host reads the device, how a non-finite run stops."""

import math

import pytest
import torch

import trainer.train_pretrain as tp
from trainer.args import parse_args
from trainer.checkpoint import step_folders
from trainer.optim import OPTIMIZERS
from trainer.tracking import read_metrics

# Every way Python code reads a tensor's value on the host; on CUDA each one waits for the GPU.
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def train_args(tmp_path, tiny_flags):
    def make(*flags, out: str = "run"):
        return parse_args([*tiny_flags, "--out_dir", str(tmp_path / out), *map(str, flags)])
    return make


@pytest.fixture
def built(monkeypatch) -> list:
    """The models train() builds, kept for inspection after it returns."""
    models, start = [], tp.start_or_resume

    def keeping(*args):
        state = start(*args)
        models.append(state.raw_model)
        return state
    monkeypatch.setattr(tp, "start_or_resume", keeping)
    return models


def test_host_reads_only_on_steps_that_log_evaluate_or_save(train_args, monkeypatch):
    args = train_args("--max_steps", 8, "--accumulation_steps", 2, "--log_interval", 4, "--eval_interval", 8,
                      "--save_interval", 8)
    current = {"step": None}  # the step the loop is in: it calls lr_at once at the start of each
    lr_at = tp.lr_at

    def tracking_lr_at(step, *rest):
        current["step"] = step
        return lr_at(step, *rest)

    monkeypatch.setattr(tp, "lr_at", tracking_lr_at)
    reads = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **kw):
            if current["step"] is not None:
                reads.append(current["step"])
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    summary = tp.train(args)
    assert summary["step"] == 8 and not summary["diverged"]
    # steps 3 and 7 (0-based) log, step 7 also evaluates and saves; the six others never wait on the device
    assert set(reads) == {3, 7}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_step_gone_non_finite_between_reads_stops_the_run_at_the_next_unsaved(train_args, optimizer):
    summary = tp.train(train_args("--learning_rate", 1e6, "--warmup_steps", 3, "--grad_clip", 0,
                                  "--norm", "none", "--log_interval", 30, "--eval_interval", 30,
                                  "--save_interval", 30, "--optimizer", optimizer, "--max_steps", 30))
    assert summary["divergence"] == "the loss or the weights became non-finite by step 30"
    assert not step_folders(summary["out_dir"])


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_float16_with_grad_scaler_skips_overflowing_steps(train_args, monkeypatch, optimizer):
    """fp16 through a GradScaler: steps whose gradients overflow are skipped on the device (no update, no
    AdamW step count) while the scale backs off, and the run goes on, not reported as diverged."""
    init_scale = 2.0**24
    grad_scaler = torch.amp.GradScaler
    scalers, optimizers = [], []
    monkeypatch.setattr(torch.amp, "GradScaler", lambda *a, **kw: scalers.append(
        grad_scaler(*a, **kw, init_scale=init_scale)) or scalers[-1])
    build_optimizer = tp.build_optimizer
    monkeypatch.setattr(tp, "build_optimizer",
                        lambda *a: optimizers.append(build_optimizer(*a)) or optimizers[-1])
    summary = tp.train(train_args("--dtype", "float16", "--max_steps", 16, "--log_interval", 8,
                                  "--learning_rate", 3e-3, "--warmup_steps", 5, "--optimizer", optimizer))
    assert not summary["diverged"] and summary["step"] == 16 and math.isfinite(summary["val_loss"])
    assert scalers[0].is_enabled()
    skipped = round(math.log2(init_scale / scalers[0].get_scale()))  # each overflow halves the scale
    assert 0 < skipped < 16
    adamw = optimizers[0] if optimizer == "adamw" else optimizers[0].adamw
    steps_taken = {state["step"].item() for state in adamw.state.values()}
    assert steps_taken == {16 - skipped}


PER_BLOCK = ("layer_grad_norm", "residual_rms", "block_cosine", "max_attn_logit", "massive_activation")


def test_per_block_diagnostics_only_on_diagnostic_steps(train_args, monkeypatch):
    args = train_args("--max_steps", 7, "--log_interval", 1, "--diag_interval", 3, "--eval_interval", 7,
                      "--save_interval", 7)
    stacked = []  # the shape of every tensor read back with .tolist()
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: stacked.append(self.shape) or tolist(self))
    tp.train(args)
    records = [r for r in read_metrics(args.out_dir + "/metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    diagnosed = [r["step"] for r in records if all(key in r for key in PER_BLOCK)]
    assert diagnosed == [3, 6, 7]  # every --diag_interval steps, and the last
    assert all(not any(key in r for key in PER_BLOCK) for r in records if r["step"] not in diagnosed)
    assert all(len(r["layer_grad_norm"]) == 2 and min(r["layer_grad_norm"]) > 0
               for r in records if r["step"] in diagnosed)
    # every per-block number of a step (the two blocks' gradient norms among them) read back in one transfer
    assert [shape[-1] for shape in stacked if len(shape) == 2] == [2] * 3
