"""scripts/gpu_check.py off a GPU: one line and a non-zero exit, nothing written. (On a GPU it runs everything.)"""

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
    assert gpu_check.eval_numbers(None, table) == {"loss": 2.4075, "ppl": 11.107, "bpb": 1.0123}
    assert gpu_check.pytest_numbers(None, "5 passed, 2 skipped in 3.1s") == {"passed": 5, "skipped": 2}
