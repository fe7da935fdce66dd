"""scripts/compare_studies.py: two studies side by side, paired per seed on one CPU type."""

import json

import pytest

from common.cli import run_cli
from scripts import compare_studies
from scripts.compare_studies import compare, spearman

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": "AMX"}
EPYC = {"cpu": "AMD EPYC", "cpu_isa": "AVX2"}


def write_study(folder, losses: dict[str, dict[int, float]], lr: float = 0.004, cpu=XEON, plateau=()):
    """A study folder as the runner writes it: each variant chosen at `lr`, one run per seed."""
    folder.mkdir(parents=True)
    tuning = [{"variant": v, "depth": 8, "chosen_lr": None if v in plateau else lr} for v in losses]
    rows = [{"variant": v, "depth": 8, "seed": s, "val_loss": loss, "diverged": False, "plateaued": v in plateau,
             "args": {"learning_rate": lr}, "environment": cpu} for v, seeds in losses.items() for s, loss in seeds.items()]
    (folder / "tuning.json").write_text(json.dumps(tuning))
    (folder / "results.json").write_text(json.dumps(rows))
    return folder


def table_row(text: str, variant: str) -> list[str]:
    return next(line for line in text.splitlines() if line.startswith(f"| {variant} |")).strip("|").split(" | ")


def test_paired_differences_and_a_swap_that_clears_the_floor(tmp_path):
    a = write_study(tmp_path / "muon", {"pre-rmsnorm": {0: 4.30, 1: 4.32}, "pre-derf": {0: 4.40, 1: 4.41},
                                        "post-rmsnorm": {0: 4.36, 1: 4.37}})
    b = write_study(tmp_path / "adamw", {"pre-rmsnorm": {0: 4.40, 1: 4.42}, "pre-derf": {0: 4.45, 1: 4.46},
                                         "post-rmsnorm": {0: 4.60, 1: 4.61}})
    text = compare(a, b, ("Muon", "AdamW"), "pre-rmsnorm", floor=0.011)
    row = table_row(text, "pre-derf")
    assert row[3].strip() == "-0.050 ± 0.000" and row[4].strip() == "2/2"  # 4.40 - 4.45, 4.41 - 4.46
    assert row[5].strip() == "+0.095 ± 0.007" and row[6].strip() == "+0.045 ± 0.007"
    # Muon: post (+0.055) ahead of derf (+0.095); AdamW: derf (+0.045) ahead of post (+0.195)
    assert "swaps: pre-derf / post-rmsnorm; of them, with every Δ beyond the floor (0.011 nats) and all seeds " \
           "agreeing in both studies: pre-derf / post-rmsnorm." in text


def test_seeds_on_another_cpu_type_do_not_pair(tmp_path):
    a = write_study(tmp_path / "a", {"pre-rmsnorm": {0: 4.3}, "pre-dyt": {0: 4.5}})
    b = write_study(tmp_path / "b", {"pre-rmsnorm": {0: 4.4}, "pre-dyt": {0: 6.2}}, cpu=EPYC)
    row = table_row(compare(a, b, ("A", "B"), "pre-rmsnorm", 0.011), "pre-dyt")
    assert row[3].strip() == "—" and row[4].strip() == "0/0 (1 across CPU types left out)"


def test_a_plateau_is_named_and_left_out_of_the_differences(tmp_path):
    a = write_study(tmp_path / "a", {"pre-rmsnorm": {0: 4.3}, "pre-derf": {0: 6.25}}, plateau=("pre-derf",))
    b = write_study(tmp_path / "b", {"pre-rmsnorm": {0: 4.4}, "pre-derf": {0: 4.5}})
    row = table_row(compare(a, b, ("A", "B"), "pre-rmsnorm", 0.011), "pre-derf")
    assert row[1].strip() == "plateau" and row[3].strip() == "—"


@pytest.mark.parametrize("a, b, rho", [({"x": 1, "y": 2, "z": 3}, {"x": 10, "y": 20, "z": 30}, 1.0),
                                       ({"x": 1, "y": 2, "z": 3}, {"x": 3, "y": 2, "z": 1}, -1.0),
                                       ({"x": 1, "y": 2}, {"x": 1, "y": 2}, None)])
def test_spearman(a, b, rho):
    assert spearman(a, b) == (rho if rho is None else pytest.approx(rho))


def test_a_folder_without_a_report_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: compare_studies.main([str(tmp_path / "empty"), str(tmp_path / "empty")]))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and len(err.splitlines()) == 1 and "has no tuning.json or results.json" in err
