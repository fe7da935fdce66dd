"""The entry points started as commands, where a fresh process is the point. Each answers bad input with exit status
2 and one line on stderr: nothing the libraries print while they load gets through, and nothing is written (the
tests beside each module check every case in-process; these processes start at once, as each spends seconds
importing torch). eval_llm.py writing into a closed pipe ends quietly."""

import subprocess
import sys
from pathlib import Path

import pytest

from model import MiniMindConfig, MiniMindForCausalLM
from tests.tiny import TINY

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # three fresh interpreters, each importing torch and transformers
def test_bad_input_is_one_error_line_from_every_command(tmp_path):
    MiniMindConfig(**TINY).save_pretrained(tmp_path / "weightless")
    MiniMindForCausalLM(MiniMindConfig(**TINY, norm_position="peri")).save_pretrained(tmp_path / "peri")
    cases = {  # script: (its arguments, the start of its one line, what it must not create)
        "trainer/train_pretrain.py": (["--out_dir", tmp_path / "run", "--norm", "groupnorm"],
                                      "error: argument --norm", tmp_path / "run"),
        "eval_llm.py": (["--model_path", tmp_path / "weightless", "--prompt", "Hi"],
                        f"error: {tmp_path / 'weightless'}: has config.json but no weights",
                        tmp_path / "weightless" / "model.safetensors"),
        "scripts/convert_to_hf.py": ([tmp_path / "peri", tmp_path / "hf"], "error: cannot export", tmp_path / "hf"),
    }
    started = {script: subprocess.Popen([sys.executable, REPO / script, *map(str, args)], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for script, (args, _, _) in cases.items()}
    for script, process in started.items():
        out, err = process.communicate(timeout=300)
        _, expected, never = cases[script]
        assert process.returncode == 2, (script, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), (script, err[-2000:])
        assert out == "" and not never.exists(), script


def test_output_into_a_closed_pipe_ends_quietly(trained_run):
    """eval_llm.py ... | head: once the reader has gone, stop without a traceback, with the status of SIGPIPE."""
    proc = subprocess.Popen([sys.executable, str(REPO / "eval_llm.py"), "--device", "cpu", "--model_path",
                             str(trained_run), "--prompt", "Full fathom five", "--max_new_tokens", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    proc.stdout.close()  # before the first write: the reader has gone
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""
