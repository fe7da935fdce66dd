"""scripts/summarize_studies.py: one table, a CSV and the figures over study folders of two optimizers and two
token budgets."""

import csv
import json
import math

from scripts import summarize_studies
from study.lr_tuning import t_two_sided_p

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": ["AVX512F", "AMX"], "git_dirty": False}


def write_study(folder, optimizer: str, steps: int, losses: dict[str, dict[int, float]], lr_from=None):
    """A folder as run_ablation.py writes it: each variant chosen at 4e-3 by tune seeds 0 and 1 (or, with
    lr_from, at the lr another folder chose), one run per seed."""
    folder.mkdir(parents=True)
    tuning = [{"variant": v, "depth": 8, "learning_rates": [2e-3, 4e-3], "val_losses": [4.6, 4.5],
               "seed_losses": [[4.6, 4.6], [4.5, 4.5]], "usable": [True, True], "chosen_lr": 4e-3,
               "tune_seeds": [0, 1]} | ({"lr_from": lr_from} if lr_from else {}) for v in losses]
    rows = [{"variant": v, "depth": 8, "seed": s, "val_loss": loss, "diverged": False, "plateaued": False,
             "args": {"learning_rate": 4e-3, "optimizer": optimizer, "max_steps": steps}, "environment": XEON}
            for v, seeds in losses.items() for s, loss in seeds.items()]
    (folder / "tuning.json").write_text(json.dumps(tuning))
    (folder / "results.json").write_text(json.dumps(rows))
    return str(folder)


def test_the_table_csv_and_figures_give_each_difference_on_the_fresh_seeds(tmp_path, capsys):
    base = {seed: 4.3 + seed / 100 for seed in range(5)}
    gaps = [0.5, 0.5, 0.20, 0.22, 0.18]
    post = {seed: loss + d for (seed, loss), d in zip(base.items(), gaps, strict=True)}
    folders = [write_study(tmp_path / "adamw-400", "adamw", 400, {"pre-rmsnorm": base, "post-rmsnorm": post}),
               write_study(tmp_path / "muon-400", "muon", 400, {"pre-rmsnorm": base, "post-rmsnorm": base}),
               write_study(tmp_path / "adamw-1600", "adamw", 1600,
                           {"pre-rmsnorm": {s: base[s] for s in (2, 3, 4)},
                            "post-rmsnorm": {s: post[s] - 0.1 for s in (2, 3, 4)}}, lr_from="adamw-400")]
    out = tmp_path / "summary"
    summarize_studies.main([*folders, "--out", str(out)])
    lines = (out / "summary.csv").read_text().splitlines()
    rows = {(r["variant"], r["optimizer"], r["steps"]): r for r in csv.DictReader(lines)}
    assert len(rows) == 6
    adamw = rows["post-rmsnorm", "adamw", "400"]
    # all 5 seeds (0.5, 0.5, 0.2, 0.22, 0.18) against the fresh ones, 2-4: the tune seeds' luck left out
    assert math.isclose(float(adamw["delta"]), 0.32) and adamw["n_pairs"] == "5"
    assert math.isclose(float(adamw["fresh_delta"]), 0.2) and adamw["fresh_n"] == "3"
    # fresh differences 0.20, 0.22, 0.18: sd 0.02, t = 0.2 / (0.02 / √3) at df 2; CI 0.2 ± 4.303 · 0.02 / √3
    assert math.isclose(float(adamw["fresh_p"]), t_two_sided_p(0.2 / (0.02 / math.sqrt(3)), 2))
    assert math.isclose(float(adamw["fresh_ci_low"]), 0.2 - 4.3027 * 0.02 / math.sqrt(3), abs_tol=1e-4)
    assert adamw["resolved"] == "True"
    assert rows["post-rmsnorm", "muon", "400"]["resolved"] == "False"  # a zero difference: p = 1
    assert rows["post-rmsnorm", "adamw", "1600"]["fresh_n"] == "3"  # every seed fresh: the lr came from 400
    table = (out / "summary.md").read_text()
    line = next(line for line in table.splitlines() if line.startswith("| post-rmsnorm | adamw |"))
    assert "| +0.200 [+0.150, +0.250], p 0.0033, n 3 | ✓ |" in line and "+0.100 [+0.050, +0.150]" in line
    assert "from a modified tree" in table and "0 of them" in table
    assert (out / "forest.png").stat().st_size and (out / "interaction.png").stat().st_size
    drawn = sorted(p.name for p in out.glob("lr_sensitivity-*.png"))
    assert drawn == ["lr_sensitivity-adamw-400.png", "lr_sensitivity-muon-400.png"]  # not the borrowed one
    assert "wrote" in capsys.readouterr().out
    summarize_studies.main([folders[0], folders[2], "--out", str(tmp_path / "adamw")])  # one optimizer: no
    assert not (tmp_path / "adamw" / "interaction.png").exists()  # interaction to draw
