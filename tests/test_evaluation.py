"""Held-out evaluation: one process, and sharded over two gloo processes, give the same loss."""

import json
import os
import subprocess
import sys
import textwrap
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

from data import BatchSampler
from trainer.evaluation import evaluate

REPO = Path(__file__).resolve().parents[1]
# 23 windows of 16 tokens (+ 1 for the last target): not a multiple of 2 ranks x 4 rows, so the shards and
# the last batches are uneven; 8 steps x 4 rows = 32 windows would reach past the split's end.
CASES = {"whole split": None, "steps past the end": 8, "one step": 1}
SETUP = """
import numpy as np, torch
from model import MiniMindConfig, MiniMindForCausalLM
torch.manual_seed(0)
model = MiniMindForCausalLM(MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1))
tokens = np.random.default_rng(0).integers(0, 64, size=23 * 16 + 1).astype(np.uint16)
"""
PROBE = """
import json, os, sys
from contextlib import nullcontext
sys.path.insert(0, {repo!r})
import torch.distributed as dist
from trainer.evaluation import evaluate
{setup}
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
losses = {{name: evaluate(model, tokens, 4, 16, steps, "cpu", nullcontext(), rank=rank, world_size=world_size)
           for name, steps in {cases!r}.items()}}
with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as f:
    json.dump(losses, f)
dist.destroy_process_group()
"""


def setup() -> tuple:
    scope = {}
    exec(SETUP, scope)
    return scope["model"], scope["tokens"]


@pytest.mark.slow  # two processes start and import torch: ~10-30 s
def test_sharded_evaluation_matches_one_process(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(PROBE.format(repo=str(REPO), setup=SETUP, cases=CASES,
                                                  out=str(tmp_path))))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(probe)]
    result = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1))
    assert r0 == r1  # all-reduced: every rank returns the same number
    model, tokens = setup()
    for name, steps in CASES.items():
        alone = evaluate(model, tokens, 4, 16, steps, "cpu", nullcontext())
        # the same windows in other batches: equal up to the float32 rounding of the batched matmuls
        assert r0[name] == pytest.approx(alone, rel=1e-6), name
    assert r0["steps past the end"] == r0["whole split"] != r0["one step"]


def test_steps_past_the_splits_end_read_each_window_once():
    """Wrapping around would count the first windows twice: the trainer's number would then differ from
    eval_llm's, which reads a split whole, for a held-out set smaller than --eval_steps x --batch_size."""
    model, tokens = setup()  # 23 windows; 8 steps x 4 rows = 32
    whole = evaluate(model, tokens, 4, 16, None, "cpu", nullcontext())
    assert evaluate(model, tokens, 4, 16, 8, "cpu", nullcontext()) == whole
    assert evaluate(model, tokens, 4, 16, 5, "cpu", nullcontext()) != whole  # 20 of the 23


def test_evaluation_weights_a_short_last_batch_by_its_windows():
    model, tokens = setup()  # 23 windows: batches of 4, 4, 4, 4, 4 and 3
    per_window = [evaluate(model, tokens[16 * k : 16 * (k + 1) + 1], 1, 16, None, "cpu", nullcontext())
                  for k in range(23)]
    assert evaluate(model, tokens, 4, 16, None, "cpu", nullcontext()) == pytest.approx(np.mean(per_window),
                                                                                        rel=1e-6)


def test_loss_from_logits_equals_the_models_own_loss():
    """evaluate() computes the loss from the logits (so every exported family works); for MiniMind it is the
    very number the model's own shift_labels loss gives, bit for bit."""
    model, tokens = setup()
    x, y = next(BatchSampler(tokens, 4, 16, shuffle=False))
    with torch.no_grad():
        own = model.eval()(input_ids=x, shift_labels=y).loss.double().item()
    assert evaluate(model, tokens, 4, 16, 1, "cpu", nullcontext()) == own
