import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_train.py"


def test_bench_train_reports_both_models_and_their_ratio():
    result = subprocess.run([sys.executable, str(SCRIPT), "--hidden_size", "32", "--num_hidden_layers", "1",
                             "--batch_size", "1", "--seq_len", "16", "--steps", "1", "--rounds", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rates = dict(re.findall(r"^(minimind|llama)\s+(\d+)\s", result.stdout, re.M))
    assert set(rates) == {"minimind", "llama"} and all(int(v) > 0 for v in rates.values())
    ratio = float(re.search(r"ratio minimind/llama: ([\d.]+)", result.stdout).group(1))
    assert abs(ratio - int(rates["minimind"]) / int(rates["llama"])) < 0.01


def test_bench_train_rejects_zero_rounds():
    result = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip() == "error: --rounds must be a positive integer, got 0"
