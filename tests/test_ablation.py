import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--num_key_value_heads", "1",
        "--max_seq_len", "32", "--batch_size", "4", "--eval_steps", "2", "--num_proc", "1", "--log_interval", "2"]


def study(tmp_path, tiny_corpus, tiny_tokenizer_dir, *flags):
    cmd = [sys.executable, str(REPO / "scripts" / "run_ablation.py"), "--out_dir", str(tmp_path / "study"),
           "--data_path", tiny_corpus, "--tokenizer_path", tiny_tokenizer_dir, *TINY, *flags]
    env = {"MINIMIND_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


def test_two_variant_two_seed_study_writes_plots_and_table(tmp_path, tiny_corpus, tiny_tokenizer_dir):
    result = study(tmp_path, tiny_corpus, tiny_tokenizer_dir, "--variants", "pre-rmsnorm", "post-layernorm",
                   "--seeds", "0", "1", "--max_steps", "8", "--eval_interval", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "study"
    for name in ("loss_curves.png", "layers.png", "results.md", "results.json"):
        assert (out / name).stat().st_size > 0, name
    runs = json.loads((out / "results.json").read_text())
    assert sorted((r["norm_position"], r["norm"], r["seed"]) for r in runs) == [
        ("post", "layernorm", 0), ("post", "layernorm", 1), ("pre", "rmsnorm", 0), ("pre", "rmsnorm", 1)]
    assert all(r["step"] == 8 and not r["diverged"] for r in runs)
    # LayerNorm carries a bias as well as a gain; Post-Norm has no final norm (4 norms at 2 layers, not 5)
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| pre-") or line.startswith("| post-")]
    assert len(rows) == 2 and all(" ± " in row and row.endswith("| 0/2 |") for row in rows)
    norm_params = {r["norm"]: r["norm_params"] for r in runs}
    assert norm_params == {"rmsnorm": 5 * 32, "layernorm": 4 * 2 * 32}
    for r in runs:
        assert (Path(r["out_dir"]) / "metrics.jsonl").is_file()

    # re-running the finished study reuses the runs instead of training again
    again = study(tmp_path, tiny_corpus, tiny_tokenizer_dir, "--variants", "pre-rmsnorm", "post-layernorm",
                  "--seeds", "0", "1", "--max_steps", "8", "--eval_interval", "4")
    assert again.returncode == 0 and "model:" not in again.stdout


def test_diverged_run_is_recorded_not_fatal(tmp_path, tiny_corpus, tiny_tokenizer_dir):
    result = study(tmp_path, tiny_corpus, tiny_tokenizer_dir, "--variants", "pre-none", "--seeds", "0",
                   "--learning_rates", "1e-3", "1e6", "--warmup_steps", "0", "--grad_clip", "0", "--max_steps", "30",
                   "--eval_interval", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "study"
    runs = {r["out_dir"].rsplit("/", 1)[-1]: r for r in json.loads((out / "results.json").read_text())}
    assert not runs["pre-none-lr0.001-wu0-s0"]["diverged"]
    assert runs["pre-none-lr1e+06-wu0-s0"]["diverged"]
    table = (out / "results.md").read_text()
    assert "| pre-none | 1e+06 | 0 | — | — | — | — | 0 | 1/1 |" in table
    assert (out / "grid-pre-none.png").stat().st_size > 0


def test_unknown_variant_is_one_line(tmp_path, tiny_corpus, tiny_tokenizer_dir):
    result = study(tmp_path, tiny_corpus, tiny_tokenizer_dir, "--variants", "pre-batchnorm")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "pre-batchnorm" in lines[0]
