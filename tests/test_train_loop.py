"""The training loop in-process: where it reads the device from the host, and how it keeps a bad update out."""

import math
from types import SimpleNamespace

import pytest
import torch

import trainer.train_pretrain as tp
from trainer.args import parse_args
from trainer.optim import OPTIMIZERS
from trainer.tracking import read_metrics

# Every way Python code reads a tensor's value on the host; on CUDA each one waits for the GPU.
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def train_args(tmp_path, monkeypatch, tiny_flags):
    monkeypatch.setenv("MINIMIND_CACHE", str(tmp_path / "cache"))

    def make(*flags, out: str = "run"):
        return parse_args([*tiny_flags, "--out_dir", str(tmp_path / out), *map(str, flags)])
    return make


@pytest.fixture
def built(monkeypatch) -> list:
    """The models train() builds, kept for inspection after it returns."""
    models, build = [], tp.build_model
    monkeypatch.setattr(tp, "build_model", lambda *a: models.append(build(*a)) or models[-1])
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
def test_non_finite_step_is_skipped_on_the_device_and_reported(train_args, built, optimizer):
    """Divergence between two log steps: the loop sees it only at the next log step, yet the weights it ends
    with are those after the last good step, bit for bit, and it reports the step that went bad. With Muon too,
    whose step has no skip flag of its own (trainer/optim.py puts its weights and momenta back)."""
    blow_up = ["--learning_rate", 1e6, "--warmup_steps", 3, "--grad_clip", 0, "--norm", "none",
               "--lr_decay_steps", 30, "--log_interval", 30, "--eval_interval", 30, "--save_interval", 30,
               "--optimizer", optimizer]
    summary = tp.train(train_args(*blow_up, "--max_steps", 30))
    good_steps = summary["step"]
    assert summary["diverged"] and 1 <= good_steps < 29  # found at step 30, it happened well before
    assert all(torch.isfinite(p).all() for p in built[0].parameters())

    # The reference trains those good steps; its final evaluation may still find the weights unusable (on some
    # CPUs their forward already overflows), but no training step of it goes bad.
    reference = tp.train(train_args(*blow_up, "--max_steps", good_steps, out="reference"))
    assert reference["step"] == good_steps
    assert not reference["diverged"] or reference["divergence"].startswith("the validation loss")
    for a, b in zip(built[0].state_dict().values(), built[1].state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_float16_with_grad_scaler_skips_overflowing_steps(train_args, monkeypatch, optimizer):
    """fp16 autocast trains through a GradScaler; a scale too large for fp16 makes the gradients overflow, and
    those steps are skipped on the device (no update, no AdamW step count) while the scale backs off: routine
    for fp16, so the run goes on and is not reported as diverged."""
    init_scale = 2.0**24
    grad_scaler = torch.amp.GradScaler
    scalers, optimizers = [], []
    monkeypatch.setattr(torch.amp, "GradScaler",
                        lambda *a, **kw: scalers.append(grad_scaler(*a, **kw, init_scale=init_scale)) or scalers[-1])
    build_optimizer = tp.build_optimizer
    monkeypatch.setattr(tp, "build_optimizer", lambda *a: optimizers.append(build_optimizer(*a)) or optimizers[-1])
    summary = tp.train(train_args("--device", "cpu", "--dtype", "float16", "--max_steps", 16, "--log_interval", 8,
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
    stacked = []  # each block-gradient read-back: one transfer of all the blocks
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist",
                        lambda self: stacked.append(self.shape) or tolist(self))
    tp.train(args)
    records = [r for r in read_metrics(args.out_dir + "/metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    diagnosed = [r["step"] for r in records if all(key in r for key in PER_BLOCK)]
    assert diagnosed == [3, 6, 7]  # every --diag_interval steps, and the last
    assert all(not any(key in r for key in PER_BLOCK) for r in records if r["step"] not in diagnosed)
    assert all(len(r["layer_grad_norm"]) == 2 and min(r["layer_grad_norm"]) > 0 for r in records if r["step"] in diagnosed)
    assert stacked.count(torch.Size([2])) == 3  # the two blocks' gradient norms, read once per diagnostic step


def test_cpu_diagnostics_default_to_every_log_step(train_args):
    assert train_args("--log_interval", 7).diag_interval == 7


def test_warm_up_step_is_timed_apart_as_compile_time(train_args, monkeypatch):
    """The first step of each start (which compiles under --compile) counts as compile_time_s, not training time:
    on a clock that only moves while the model computes, 1000 s in the first forward and 1 s in each other."""
    clock = {"now": 0.0, "calls": 0}
    forward = tp.MiniMindForCausalLM.forward

    def timed_forward(self, *a, **kw):
        clock["now"] += 1000.0 if clock["calls"] == 0 else 1.0
        clock["calls"] += 1
        return forward(self, *a, **kw)

    monkeypatch.setattr(tp.MiniMindForCausalLM, "forward", timed_forward)
    monkeypatch.setattr(tp, "time", SimpleNamespace(perf_counter=lambda: clock["now"]))
    flags = ("--log_interval", 2, "--eval_interval", 100, "--save_interval", 4, "--lr_decay_steps", 6)
    summary = tp.train(train_args("--max_steps", 4, *flags))
    assert summary["compile_time_s"] == 1000 and summary["train_time_s"] == 3  # steps 2-4
    tokens_per_step = 4 * 32
    assert summary["tokens_per_s"] == tokens_per_step and summary["s_per_step"] == 1
    records = [r for r in read_metrics(summary["out_dir"] + "/metrics.jsonl") if r["split"] == "train"]
    # the first window's speed is that of its one timed step (step 2), not diluted by the warm-up
    assert [(r["tokens_per_s"], r["train_time_s"], r["compile_time_s"]) for r in records] == [
        (tokens_per_step, 1, 1000), (tokens_per_step, 3, 1000)]

    clock["calls"] = 0  # a resumed run warms up again, and its summary keeps both starts apart
    resumed = tp.train(train_args("--max_steps", 6, "--resume", *flags))
    assert resumed["compile_time_s"] == 2000 and resumed["train_time_s"] == 4 and resumed["s_per_step"] == 1


def test_resuming_a_bfloat16_or_float32_checkpoint_in_float16_starts_a_fresh_scaler(train_args, capsys):
    flags = ("--log_interval", 2, "--eval_interval", 100, "--save_interval", 2, "--lr_decay_steps", 4)
    tp.train(train_args("--max_steps", 2, *flags))
    summary = tp.train(train_args("--max_steps", 4, "--resume", "--dtype", "float16", *flags))
    assert summary["step"] == 4 and not summary["diverged"]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: --resume:")]
    assert len(notes) == 1 and "fresh GradScaler" in notes[0]
