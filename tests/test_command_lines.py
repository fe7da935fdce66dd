"""Each entry point, started as a command, answers bad input with exit status 2 and one line on stderr: nothing
the libraries print while they load gets through, and nothing is written. The tests beside each module check every
case in-process; this one checks the fresh processes, started at once because each spends seconds importing torch."""

import subprocess
import sys
from pathlib import Path

from model import MiniMindConfig, MiniMindForCausalLM
from tests.tiny import TINY

REPO = Path(__file__).resolve().parents[1]


def test_bad_input_is_one_error_line_from_every_command(tmp_path):
    MiniMindConfig(**TINY).save_pretrained(tmp_path / "weightless")
    MiniMindForCausalLM(MiniMindConfig(**TINY, norm_position="peri")).save_pretrained(tmp_path / "peri")
    cases = {  # script: (its arguments, the start of its one line, what it must not create)
        "trainer/train_pretrain.py": (["--out_dir", tmp_path / "run", "--norm", "groupnorm"],
                                      "error: argument --norm: invalid choice", tmp_path / "run"),
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
