"""scripts/gpu_check.py off a GPU: one line and a non-zero exit, nothing written. (On a GPU it runs everything.)"""

import json

import pytest
import torch

from common.cli import UserError
from scripts import gpu_check


def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^no usable CUDA GPU here \(torch .*\); .* needs one$") as err:
        gpu_check.main(["--out", str(tmp_path / "out")])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_reads_the_metrics_row_of_eval_llm():
    table = "checkpoint  variant      loss     ppl     bpb\nrun         pre-rmsnorm  2.4075  11.107  1.0123\n"
    assert gpu_check.eval_numbers(table) == {"loss": 2.4075, "ppl": 11.107, "bpb": 1.0123}
    assert gpu_check.pytest_numbers("5 passed, 2 skipped in 3.1s") == {"passed": 5, "skipped": 2}


def test_every_step_is_reported_and_a_failure_fails_the_check(tmp_path, monkeypatch):
    """With the steps stood in for by tiny commands: each one's status and numbers reach gpu_check.md and
    .json (a step past its limit with what it printed), a step once less than 30 s of the budget (or of its own
    limit) is left is skipped, and a failed step makes the exit status non-zero."""
    python = gpu_check.PY
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "machine", lambda: {"device": "NVIDIA H100 80GB HBM3", "devices": 1,
                                                       "memory_gib": 79.2, "capability": "9.0", "torch": "2.x",
                                                       "cuda": "13.0", "cudnn": 91000, "python": "3.12",
                                                       "date": "today"})
    monkeypatch.setattr(gpu_check, "steps", lambda out: [
        ("tests", [python, "-c", "print('3 passed, 1 skipped in 2.0s')"], 10, gpu_check.pytest_numbers),
        ("broken", [python, "-c", "import sys; print('boom'); sys.exit(3)"], 10, gpu_check.pytest_numbers),
        ("hangs", [python, "-c", "import time; print('started', flush=True); time.sleep(60)"], 1,
         gpu_check.eval_numbers),
        ("too long", [python, "-c", "pass"], 10**6, gpu_check.pytest_numbers),
    ])
    with pytest.raises(SystemExit) as exit_status:
        gpu_check.main(["--out", str(tmp_path), "--budget", "20"])
    assert exit_status.value.code == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(s["name"], s["status"]) for s in report["steps"]] == [
        ("tests", "ok"), ("broken", "exit 3"), ("hangs", "timed out after 1 s"), ("too long", "skipped")]
    assert report["steps"][0]["numbers"] == {"passed": 3, "skipped": 1}
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.startswith("# GPU check: NVIDIA H100 80GB HBM3") and "## broken: exit 3" in markdown and "boom" in markdown
    assert "## hangs: timed out after 1 s" in markdown
    assert "started" in (tmp_path / "logs" / "hangs.log").read_text()
