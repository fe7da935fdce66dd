"""extras/bench/bench_train.py at a tiny size: a row per model and mode, the ratio of their rates, a compile
time only for compiled rows, no MFU on a CPU, and the JSON record of the same rows."""

import json
import re

import pytest

from extras.bench import bench_train

TINY = ["--device", "cpu", "--hidden_size", "32", "--num_hidden_layers", "1", "--batch_size", "1",
        "--seq_len", "16", "--steps", "1", "--rounds", "2"]
ROW = re.compile(r"^(minimind|llama)\s+(eager|compiled)\s+(\d+)\s+([\d.]+)\s+(\S+)\s+(\S+)$", re.M)


def bench(capsys, *flags: str) -> tuple[str, dict]:
    """What the script prints, run in this process, and its table's rows by (model, mode), checked."""
    capsys.readouterr()
    bench_train.main([*TINY, *flags])
    out = capsys.readouterr().out
    rows = {(m[0], m[1]): m for m in ROW.findall(out)}
    modes = {mode for _, mode in rows}
    assert set(rows) == {(name, mode) for name in ("minimind", "llama") for mode in modes}
    for mode in modes:
        rates = {name: int(rows[name, mode][2]) for name in ("minimind", "llama")}
        ratio = float(re.search(rf"ratio minimind/llama {mode}: ([\d.]+)", out).group(1))
        assert all(v > 0 for v in rates.values())
        assert ratio == pytest.approx(rates["minimind"] / rates["llama"], rel=0.03)  # the rates are rounded
    for (_, mode), row in rows.items():
        assert row[5] == "-" and (row[4] == "-") == (mode == "eager")  # no MFU on a CPU; compile s, compiled
    return out, rows


def test_eager_rows_their_ratio_and_json(tmp_path, capsys):
    _, rows = bench(capsys, "--modes", "eager", "--json", str(tmp_path / "bench.json"))
    assert {mode for _, mode in rows} == {"eager"}
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["environment"]["threads"] >= 1 and data["environment"]["device"]
    assert [(r["model"], r["mode"]) for r in data["results"]] == [("minimind", "eager"), ("llama", "eager")]
    assert all(round(r["tokens_per_s"]) == int(rows[r["model"], r["mode"]][2]) for r in data["results"])


@pytest.mark.slow  # inductor compiles both models
def test_compiled_rows_report_compile_time(capsys, fresh_dynamo):
    out, rows = bench(capsys)
    assert {mode for _, mode in rows} == {"eager", "compiled"}
    assert all(float(row[4]) > 0 for (_, mode), row in rows.items() if mode == "compiled")
    assert re.search(r"^compiled/eager minimind: [\d.]+$", out, re.M)
