"""The entry points started as commands, where a fresh process is the point: bad input is exit status 2 and
one line on stderr, whatever the libraries print while they load, and nothing is written (every case
in-process: test_args.py, test_eval_llm.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from data import DEFAULT_TOKENIZER_DIR
from model import MiniMindConfig
from tests.tiny import TINY

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = DEFAULT_TOKENIZER_DIR


@pytest.mark.slow  # two fresh interpreters, each importing torch and transformers
def test_bad_input_is_one_error_line_from_every_command(tmp_path):
    weightless = tmp_path / "weightless"
    MiniMindConfig(**TINY).save_pretrained(weightless)
    cases = {  # script: (its arguments, the start of its one line, what it must not create)
        "trainer/train_pretrain.py": (["--out_dir", tmp_path / "run", "--norm", "groupnorm"],
                                      "error: argument --norm_type/--norm: invalid choice", tmp_path / "run"),
        "eval_llm.py": (["--model_path", weightless, "--prompt", "Hi", "--tokenizer_path", TOKENIZER],
                        f"error: {weightless}: no checkpoint loads", weightless / "model.safetensors"),
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


@pytest.mark.slow  # a fresh interpreter importing torch and transformers
def test_eval_llm_piped_into_a_reader_that_stops_ends_without_a_traceback(trained_run):
    """e.g. `python eval_llm.py ... | head -1`, here a reader gone before the first line."""
    process = subprocess.Popen([sys.executable, REPO / "eval_llm.py", "--model_path", trained_run,
                                "--device", "cpu", "--prompt", "Hi", "--max_new_tokens", "8"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=300) == 1 and "Traceback" not in err and "BrokenPipe" not in err, err
