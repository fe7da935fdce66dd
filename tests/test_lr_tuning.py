"""The fair-study protocol's arithmetic on hand-made results: the lr choice, the grid's growth, the usable
range, the paired differences and their t-test (the runner's --tune_lr end to end is in test_ablation.py)."""

import math

import pytest

from study.lr_tuning import (
    Point,
    Stats,
    choose_lr,
    edge_extension,
    fresh,
    grid_point,
    paired_difference,
    paired_runs,
    paired_stats,
    resolved,
    t_critical,
    t_two_sided_p,
    usable_range,
)
from study.report import fair_table, paired_cells, stats_cell


def test_the_lowest_usable_loss_wins_and_failed_runs_never_do():
    points = [Point(1e-3, 4.50, True), Point(2e-3, 4.31, True), Point(4e-3, 4.40, True)]
    assert choose_lr(points) == 2e-3
    # a diverged run (no loss) and a plateaued one (lowest loss here, but unusable) cannot win
    assert choose_lr([*points, Point(8e-3, None, False), Point(1.6e-2, 4.0, False)]) == 2e-3
    assert choose_lr([Point(1e-3, None, False), Point(2e-3, 5.0, False)]) is None
    assert choose_lr([]) is None
    # an exact tie goes to the smaller, safer lr, whatever the order of the grid
    assert choose_lr([Point(4e-3, 4.2, True), Point(2e-3, 4.2, True), Point(8e-3, 4.3, True)]) == 2e-3


@pytest.mark.parametrize(("grid", "chosen", "added"), [
    ([1e-3, 2e-3, 4e-3], 1e-3, [5e-4]), ([1e-3, 2e-3, 4e-3], 4e-3, [8e-3]), ([1e-3, 2e-3, 4e-3], 2e-3, []),
    ([1e-3], 1e-3, []),  # a single point has no direction to grow in
    ([1e-3, 2e-3, 4e-3], None, [5e-4, 8e-3]), ([5e-4, 1e-3, 2e-3, 4e-3], None, [2.5e-4, 8e-3]), ([1e-3],
                                                                                                 None, []),
])
def test_a_winner_at_an_edge_grows_the_grid_by_two_and_a_grid_where_nothing_trains_grows_both_ways(
        grid, chosen, added):
    assert edge_extension(grid, chosen) == added


def test_an_lr_scores_the_mean_of_its_tune_seeds_and_any_failed_seed_disqualifies_it():
    assert grid_point(2e-3, [Point(2e-3, 4.2, True), Point(2e-3, 4.4, True)]) == Point(
        2e-3, pytest.approx(4.3), True)
    # one seed plateaued: the mean is kept for the figure, but the lr cannot win
    assert grid_point(4e-3, [Point(4e-3, 4.0, True), Point(4e-3, 4.1, False)]) == Point(
        4e-3, pytest.approx(4.05), False)
    # one seed diverged: no loss, and the survivors' mean does not stand in for it
    assert grid_point(8e-3, [Point(8e-3, 3.9, True), Point(8e-3, None, False)]) == Point(8e-3, None, False)
    # seed 0 alone would pick 2e-3, the mean of both picks 4e-3
    seeds = {2e-3: [Point(2e-3, 4.20, True), Point(2e-3, 4.40, True)],
             4e-3: [Point(4e-3, 4.25, True), Point(4e-3, 4.30, True)]}
    assert choose_lr([points[0] for points in seeds.values()]) == 2e-3
    assert choose_lr([grid_point(lr, points) for lr, points in seeds.items()]) == 4e-3


def test_usable_range_is_every_usable_point_within_the_margin_of_the_best():
    points = [Point(1e-3, 4.50, True), Point(2e-3, 4.34, True), Point(4e-3, 4.30, True),
              Point(8e-3, 4.32, False), Point(1.6e-2, None, False)]
    assert usable_range(points) == [2e-3, 4e-3]  # 4.50 is 0.2 away; 8e-3 plateaued
    assert usable_range([Point(1e-3, None, False)]) == []


def test_paired_difference_is_per_seed_on_the_seeds_both_finished():
    variant = {0: 4.0, 1: 4.2, 2: 3.9, 4: None}
    baseline = {0: 4.1, 1: 4.1, 2: 4.0, 3: 5.0, 4: 4.0}
    d = paired_difference(variant, baseline)
    assert sorted(d) == [0, 1, 2] and [round(v, 12) for v in d.values()] == [-0.1, 0.1, -0.1]
    assert paired_difference({0: float("nan")}, {0: 4.0}) == {}


# Student's t from printed tables: (two-sided 95%, i.e. t(0.975)) and t(0.995) per df, to 4 significant digits
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042}
T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 5: 4.032, 10: 3.169, 30: 2.750}


@pytest.mark.parametrize("df", T_975)
def test_t_critical_values_match_the_printed_table(df):
    assert t_critical(0.95, df) == pytest.approx(T_975[df], abs=6e-4)
    if df in T_995:
        assert t_critical(0.99, df) == pytest.approx(T_995[df], abs=6e-4)


@pytest.mark.parametrize(("t", "df", "p"), [
    (2.0, 5, 0.1019), (4.303, 2, 0.0500), (-4.303, 2, 0.0500), (2.228, 10, 0.0500), (0.0, 3, 1.0),
    (1.0, 1, 0.5),  # df 1 is Cauchy: P(|T| ≥ 1) = 1 − 2·atan(1)/π
    (1.0, 2, 1 - 1 / math.sqrt(3)),  # df 2: P(|T| ≥ t) = 1 − t / √(2 + t²)
    (3.0, 3, 0.0577), (2.0, 30, 0.0546),
])
def test_two_sided_p_matches_known_values(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=1e-4)


def test_paired_stats_on_a_hand_computed_example():
    s = paired_stats({0: 0.1, 1: 0.2, 2: 0.3})  # t = 0.2 / (0.1 / √3) = 3.464, df 2
    assert (s.n, s.mean, s.sd) == (3, pytest.approx(0.2), pytest.approx(0.1))
    assert s.p == pytest.approx(1 - 3.4641 / math.sqrt(2 + 3.4641 ** 2), abs=1e-4)  # df 2's closed form
    assert s.p == pytest.approx(0.0742, abs=1e-4)
    assert (s.ci_low, s.ci_high) == (pytest.approx(-0.0484, abs=1e-4), pytest.approx(0.4484, abs=1e-4))
    # below 2 seeds no CI and no p; identical differences: p 0 (or 1 when they are all 0)
    assert paired_stats({3: -0.5}) == Stats(1, -0.5) and paired_stats({}) == Stats(0, None)
    assert paired_stats({0: 0.1, 1: 0.1}).p == 0.0 and paired_stats({0: 0.0, 1: 0.0}).p == 1.0


def test_fresh_seeds_leave_out_both_sides_tune_seeds_and_old_folders_tuned_on_seed_0():
    d = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}
    assert fresh(d, {"tune_seeds": [0, 1]}, {"tune_seeds": [0, 3]}) == {2: 0.3}
    assert fresh(d, {"variant": "old"}, {}) == {1: 0.2, 2: 0.3, 3: 0.4}


def test_resolved_is_p_below_001_in_one_study_and_below_005_with_one_sign_in_two():
    strong, weak, against = (Stats(3, -0.1, p=0.009), Stats(3, -0.1, p=0.04), Stats(3, +0.1, p=0.001))
    assert resolved(strong) and not resolved(weak) and not resolved(Stats(1, -0.1))
    assert resolved(weak, weak) and resolved(strong, weak)
    assert not resolved(weak, Stats(3, -0.1, p=0.06)) and not resolved(strong, against)


def test_paired_cells_show_the_ci_the_fresh_seeds_and_the_verdict():
    tune = {"tune_seeds": [0]}
    cells, whole, decided = paired_cells({0: -0.2, 1: -0.1, 2: -0.101, 3: -0.1}, 1, tune, tune)
    assert cells[0].startswith(stats_cell(whole)) and cells[0].endswith(" (1 across CPU types left out)")
    assert decided.n == 3 and cells[1] == stats_cell(decided) and cells[2] == "✓"  # fresh: 1, 2, 3
    assert stats_cell(Stats(1, 0.05)) == "+0.050 [—], p —, n 1" and stats_cell(Stats(0, None)) == "—"
    # too few fresh seeds: the verdict rests on all of them and says so
    assert paired_cells({0: -0.2, 1: -0.1}, 0, tune, tune)[0][2] == "no (tune seeds in)"


def run(seed: int, cpu: tuple = (None, None), loss: float = 4.0) -> dict:
    """A run's summary cut to its seed, loss and CPU, without the fields not given (a run recorded before
    them)."""
    env = {"device": "NVIDIA H100 80GB HBM3", "cpu": cpu[0], "cpu_isa": cpu[1]}
    return {"seed": seed, "val_loss": loss, "diverged": False,
            "environment": {k: v for k, v in env.items() if v is not None}}


def test_seeds_pair_only_across_runs_of_one_cpu_model_and_extensions():
    amx = ("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512", "AMX"])
    baseline = [run(0, amx), run(1, amx), run(2, amx), run(3, amx), run(4)]
    variant = [run(0, amx, 4.1), run(1, amx, 4.2),
               # the same name, other hardware
               run(2, ("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512"]), 3.0),
               run(3, ("AMD EPYC 9654", amx[1]), 3.0),  # another model with the same extensions
               run(4, loss=4.3)]  # neither recorded its CPU: one type, they pair
    differences, left_out = paired_runs(variant, baseline)
    assert differences == pytest.approx({0: 0.1, 1: 0.2, 4: 0.3}) and left_out == 2
    # the GPU does not decide it: the host's CPU does (it feeds the GPU)
    assert paired_runs([{**run(0, amx), "environment": {"device": "cpu", "cpu": amx[0], "cpu_isa": amx[1]}}],
                       [run(0, amx)]) == ({0: 0.0}, 0)
    baseline, variant = baseline[:3], variant[:3]
    # in the report: the difference over the kept seeds, and what was left out
    groups = {("pre-rmsnorm", 8, 1e-3, 0): [{**r, "diverged": False, "plateaued": False} for r in baseline],
              ("pre-derf", 8, 1e-3, 0): [{**r, "diverged": False, "plateaued": False} for r in variant]}
    tuning = [{"variant": v, "depth": 8, "chosen_lr": 1e-3, "at_edge": False, "usable_range": [1e-3],
               "learning_rates": [1e-3]} for v in ("pre-rmsnorm", "pre-derf")]
    row = fair_table(groups, tuning, "pre-rmsnorm").splitlines()[-1]
    # seeds 0 and 1: +0.1, +0.2; mean 0.15, sd 0.0707, t 3, df 1: p = 1 − 2·atan(3)/π, CI 0.15 ± 12.706 · 0.05
    assert ("| 3.767 ± 0.666 (3) | +0.150 [-0.485, +0.785], p 0.2, n 2 (1 across CPU types left out) "
            "| +0.200 [—], p —, n 1 | no (tune seeds in) | 0/3 | 0/3 |") in row
    assert t_two_sided_p(3.0, 1) == pytest.approx(1 - 2 * math.atan(3) / math.pi)
