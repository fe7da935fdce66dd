"""scripts/compare_studies.py: two studies side by side, paired per seed on one CPU type."""

import json
import math

import pytest

from common.cli import run_cli
from scripts import compare_studies
from scripts.compare_studies import compare
from study.lr_tuning import t_two_sided_p

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": "AMX"}
EPYC = {"cpu": "AMD EPYC", "cpu_isa": "AVX2"}


def write_study(folder, losses: dict[str, dict[int, float]], lr=0.004, cpu=XEON, plateau=(), tune=None):
    """A study folder as the runner writes it: each variant chosen at `lr`, one run per seed; without
    `tune`, as folders were written before tuning.json recorded the tune seeds (seed 0 tuned alone)."""
    folder.mkdir(parents=True)
    tuning = [{"variant": v, "depth": 8, "chosen_lr": None if v in plateau else lr}
              | ({"tune_seeds": tune} if tune else {}) for v in losses]
    rows = [{"variant": v, "depth": 8, "seed": s, "val_loss": loss, "diverged": False,
             "plateaued": v in plateau,
             "args": {"learning_rate": lr}, "environment": cpu} for v, seeds in losses.items() for s,
            loss in seeds.items()]
    (folder / "tuning.json").write_text(json.dumps(tuning))
    (folder / "results.json").write_text(json.dumps(rows))
    return folder


def table_row(text: str, variant: str) -> list[str]:
    """The cells: variant, the two studies' lr and loss, A − B (all seeds, fresh, resolved), Δ A (all, fresh),
    Δ B (all, fresh), whether the Δ is resolved in both."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {variant} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def shifted(base: dict[int, float], by: list[float]) -> dict[int, float]:
    return {seed: loss + d for (seed, loss), d in zip(base.items(), by, strict=True)}


def test_differences_with_their_ci_p_and_fresh_seeds_and_the_interaction(tmp_path):
    base_a, base_b = {0: 4.30, 1: 4.32, 2: 4.31, 3: 4.33}, {0: 4.40, 1: 4.42, 2: 4.41, 3: 4.43}
    a = write_study(tmp_path / "muon", {"pre-rmsnorm": base_a,
                                        "pre-derf": shifted(base_a, [0.10, 0.09, 0.11, 0.10]),
                                        "post-rmsnorm": shifted(base_a, [0.05, 0.06, 0.05, 0.055])})
    b = write_study(tmp_path / "adamw", {"pre-rmsnorm": base_b,
                                         "pre-derf": shifted(base_b, [0.05, 0.04, 0.05, 0.045]),
                                         "post-rmsnorm": shifted(base_b, [0.20, 0.19, 0.21, 0.20])})
    text = compare(a, b, ("Muon", "AdamW"), "pre-rmsnorm")
    row = table_row(text, "pre-derf")
    # Δ Muon over all 4 seeds: mean 0.1, sd √(2e-4 / 3) = 0.00816, CI 0.1 ± 3.182 · 0.00816 / 2, t 24.5
    p = t_two_sided_p(0.1 / (math.sqrt(2e-4 / 3) / 2), 3)
    assert row[6] == f"+0.100 [+0.087, +0.113], p {p:.2g}, n 4"
    # fresh: seed 0 chose the lr in these (old) folders, so seeds 1-3: 0.09, 0.11, 0.10, t 17.3 at df 2
    assert row[7].startswith("+0.100 [+0.075, +0.125], p 0.0033, n 3")
    # Muon − AdamW, seed by seed: -0.05, -0.05, -0.04, -0.045; the fresh seeds' t is 15.6 at df 2: resolved
    assert row[3:6] == ["-0.046 [-0.054, -0.039], p 0.0003, n 4",
                        "-0.045 [-0.057, -0.033], p 0.0041, n 3", "✓"]
    assert row[10] == "✓"  # both Δs > 0 with p < 0.05
    # Δ Muon − Δ AdamW, seed by seed: 0.05, 0.05, 0.06, 0.055; fresh (1-3): mean 0.055, sd 0.005, t 19.1
    p = t_two_sided_p(0.055 / (0.005 / math.sqrt(3)), 2)
    assert row[11].endswith(", n 4") and row[12] == f"+0.055 [+0.043, +0.067], p {p:.2g}, n 3"
    assert row[13] == "✓"
    assert table_row(text, "post-rmsnorm")[12].startswith("-0.145 [")  # −0.13, −0.16, −0.145 on seeds 1-3
    assert table_row(text, "pre-rmsnorm")[6:] == ["—"] * 8


def test_the_fresh_seeds_leave_out_either_studys_tune_seeds_and_too_few_fall_back_to_all(tmp_path):
    base = {0: 4.3, 1: 4.3, 2: 4.3}
    a = write_study(tmp_path / "a", {"pre-rmsnorm": base, "pre-dyt": shifted(base, [0.1, 0.1, 0.2])},
                    tune=[0, 1])
    b = write_study(tmp_path / "b", {"pre-rmsnorm": base, "pre-dyt": shifted(base, [0.1, 0.2, 0.1])},
                    tune=[0])
    row = table_row(compare(a, b, ("A", "B"), "pre-rmsnorm"), "pre-dyt")
    assert row[4] == "+0.100 [—], p —, n 1" and row[5] == "no (tune seeds in)"  # seed 2 alone is fresh
    assert row[7] == "+0.200 [—], p —, n 1" and row[9].endswith(", n 2")  # A tuned on 0 and 1, B on 0


def test_seeds_on_another_cpu_type_do_not_pair(tmp_path):
    a = write_study(tmp_path / "a", {"pre-rmsnorm": {0: 4.3}, "pre-dyt": {0: 4.5}})
    b = write_study(tmp_path / "b", {"pre-rmsnorm": {0: 4.4}, "pre-dyt": {0: 6.2}}, cpu=EPYC)
    row = table_row(compare(a, b, ("A", "B"), "pre-rmsnorm"), "pre-dyt")
    assert row[3] == "— (1 across CPU types left out)" and row[5] == "—"


def test_a_plateau_is_named_and_left_out_of_the_differences(tmp_path):
    a = write_study(tmp_path / "a", {"pre-rmsnorm": {0: 4.3}, "pre-derf": {0: 6.25}}, plateau=("pre-derf",))
    b = write_study(tmp_path / "b", {"pre-rmsnorm": {0: 4.4}, "pre-derf": {0: 4.5}})
    row = table_row(compare(a, b, ("A", "B"), "pre-rmsnorm"), "pre-derf")
    assert row[1] == "plateau" and row[3] == "—" and row[10] == "—"


def test_a_folder_without_a_report_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: compare_studies.main([str(tmp_path / "empty"), str(tmp_path / "empty")]))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and len(err.splitlines()) == 1
    assert "has no tuning.json or results.json" in err
