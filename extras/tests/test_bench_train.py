"""extras/bench/bench_train.py at a tiny size: a row per model and mode, the ratio of their rates, a compile
time only for compiled rows, no MFU on a CPU, and the JSON record of the same rows."""

import json
import math
import re

import pytest

from common.cli import UserError
from extras.bench import bench_train
from study import claims

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


def test_norms_time_minimind_with_each_norm_and_write_the_rounds_the_speed_claims_read(tmp_path, capsys):
    bench_train.main([*TINY, "--modes", "eager", "--rounds", "3", "--norms", "rmsnorm", "layernorm",
                      "--timings", str(tmp_path)])
    out = capsys.readouterr().out
    assert re.search(r"^ratio pre-rmsnorm/pre-layernorm eager: [\d.]+$", out, re.M)
    timings = json.loads((tmp_path / "eager" / "timings.json").read_text())
    per_step = timings["seconds_per_step"]
    assert sorted(per_step) == ["pre-layernorm", "pre-rmsnorm"]
    assert all(len(times) == 3 and min(times) > 0 for times in per_step.values())
    assert (timings["mode"], timings["layers"], timings["hidden_size"]) == ("eager", 1, 32)
    claim = {"claim": "RMSNorm is faster", "variant": "pre-rmsnorm", "baseline": "pre-layernorm",
             "expected": "ahead", "metric": "seconds per step", "primary": "eager", "folders": ["eager"]}
    row = claims.compute_all(tmp_path, [claim])[0]
    assert row["seeds"] == 3 and row["val"].df == 2 and math.isfinite(row["val"].mean)


def test_timings_need_norms():
    with pytest.raises(UserError, match="--timings records the rounds of a --norms comparison"):
        bench_train.main([*TINY, "--timings", "out"])
