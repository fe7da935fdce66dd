import json
import re

import pytest

from common.cli import run_cli
from scripts import bench_train

TINY = ["--device", "cpu", "--hidden_size", "32", "--num_hidden_layers", "1", "--batch_size", "1", "--seq_len", "16",
        "--steps", "1", "--rounds", "2"]
ROW = re.compile(r"^(minimind|llama)\s+(eager|compiled)\s+(\d+)\s+([\d.]+)\s+(\S+)\s+(\S+)$", re.M)


def bench(capsys, *flags: str) -> tuple[str, dict]:
    """What the script prints to stdout, run in this process, and its table's rows by (model, mode), checked: a
    row per model and mode, the ratio of the rates, a compile time only for compiled rows, no MFU on a CPU."""
    capsys.readouterr()
    bench_train.main([*TINY, *flags])
    out = capsys.readouterr().out
    rows = {(m[0], m[1]): m for m in ROW.findall(out)}
    modes = {mode for _, mode in rows}
    assert set(rows) == {(name, mode) for name in ("minimind", "llama") for mode in modes}
    for mode in modes:
        rates = {name: int(rows[name, mode][2]) for name in ("minimind", "llama")}
        assert all(v > 0 for v in rates.values())
        ratio = float(re.search(rf"ratio minimind/llama {mode}: ([\d.]+)", out).group(1))
        assert ratio == pytest.approx(rates["minimind"] / rates["llama"], rel=0.03)  # rates are printed rounded
    for (_, mode), row in rows.items():
        assert row[5] == "-"  # no MFU on a CPU
        assert (row[4] == "-") == (mode == "eager")
    return out, rows


def test_bench_train_eager_rows_and_their_ratio(tmp_path, capsys):
    _, rows = bench(capsys, "--modes", "eager", "--json", str(tmp_path / "bench.json"))
    assert {mode for _, mode in rows} == {"eager"}
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["environment"]["threads"] >= 1 and data["environment"]["device"]
    assert [(r["model"], r["mode"]) for r in data["results"]] == [("minimind", "eager"), ("llama", "eager")]
    assert all(round(r["tokens_per_s"]) == int(rows[r["model"], r["mode"]][2]) for r in data["results"])


@pytest.mark.slow  # inductor compiles both models
def test_bench_train_compiled_rows_report_compile_time(capsys, fresh_dynamo):
    out, rows = bench(capsys)
    assert {mode for _, mode in rows} == {"eager", "compiled"}
    assert all(float(row[4]) > 0 for (_, mode), row in rows.items() if mode == "compiled")
    assert re.search(r"^compiled/eager minimind: [\d.]+$", out, re.M)


@pytest.mark.parametrize("flags,message", [
    (["--rounds", "0"], "error: --rounds must be a positive integer, got 0"),
    (["--modes", "eager,jit"], "error: --modes: unknown ['jit']; allowed: ['eager', 'compiled']"),
    *[(["--hidden_size", size], "error: --hidden_size must be a multiple of 16 (8 attention heads, each of an even "
                                "width for rotary embeddings), got " + size) for size in ("63", "72")],
])
def test_bench_train_rejects_bad_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: bench_train.main(flags))
    assert stopped.value.code == 2 and capsys.readouterr().err.strip() == message
