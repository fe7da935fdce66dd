"""extras/bench/gpu_check.py off a GPU: one line, nothing run; with its steps stood in for by tiny commands,
each one's status and output printed, a step that no longer fits skipped, and a failure failing the check."""

import re
import sys

import pytest
import torch

from common.cli import UserError
from extras.bench import gpu_check


def test_without_cuda_it_refuses_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check, "steps", lambda: pytest.fail("ran a step"))
    with pytest.raises(UserError, match=r"^no usable CUDA GPU here \(torch [^\n]*\); [^\n]* needs one$"):
        gpu_check.main([])


def test_every_step_is_reported_and_a_failure_fails_the_check(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(gpu_check, "steps", lambda: [
        ("tests", [sys.executable, "-c", "print('3 passed, 1 skipped in 2.0s')"], 10),
        ("broken", [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], 10),
        ("hangs", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 1),
        ("too long", [sys.executable, "-c", "pass"], 10**6),  # less than 30 s of the budget is left by then
    ])
    with pytest.raises(SystemExit) as exit_status:
        gpu_check.main(["--budget", "20"])
    assert exit_status.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("NVIDIA H100 80GB HBM3, torch ")
    statuses = [re.sub(r"\d+ s", "N s", line) for line in lines if line.startswith("== ")]
    assert statuses == ["== tests: ok in N s", "== broken: exit 3 in N s",
                        "== hangs: timed out after N s in N s", "== too long: skipped (N s of --budget left)"]
    assert "3 passed, 1 skipped in 2.0s" in lines and "boom" in lines and "started" in lines
