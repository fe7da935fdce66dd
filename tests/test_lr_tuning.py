"""The fair-study protocol's arithmetic on hand-made results: the lr choice, the grid's growth, the usable range and
the paired differences (the runner's --tune_lr end to end is in test_ablation.py)."""

import math

import pytest

from study.lr_tuning import (
    Point,
    choose_lr,
    edge_extension,
    grid_point,
    pair_by_seed,
    paired_difference,
    same_cpu_type,
    usable_range,
)
from study.report import fair_table


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
    ([1e-3, 2e-3, 4e-3], None, [5e-4, 8e-3]), ([5e-4, 1e-3, 2e-3, 4e-3], None, [2.5e-4, 8e-3]), ([1e-3], None, []),
])
def test_a_winner_at_an_edge_grows_the_grid_by_two_and_a_grid_where_nothing_trains_grows_both_ways(
        grid, chosen, added):
    assert edge_extension(grid, chosen) == added


def test_an_lr_scores_the_mean_of_its_tune_seeds_and_any_failed_seed_disqualifies_it():
    assert grid_point(2e-3, [Point(2e-3, 4.2, True), Point(2e-3, 4.4, True)]) == Point(2e-3, pytest.approx(4.3), True)
    # one seed plateaued: the mean is kept for the figure, but the lr cannot win
    assert grid_point(4e-3, [Point(4e-3, 4.0, True), Point(4e-3, 4.1, False)]) == Point(4e-3, pytest.approx(4.05),
                                                                                           False)
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
    assert sorted(d.differences) == [0, 1, 2]
    assert [round(v, 12) for v in d.differences.values()] == [-0.1, 0.1, -0.1]
    assert d.mean == pytest.approx(-0.1 / 3)
    assert d.std == pytest.approx(math.sqrt(((-0.1 + 0.1 / 3) ** 2 * 2 + (0.1 + 0.1 / 3) ** 2) / 2))
    assert d.agreeing == 2  # two seeds lower, one higher
    single = paired_difference({0: 4.0}, {0: 4.5})
    assert (single.mean, single.std, single.agreeing) == (pytest.approx(-0.5), None, 1)
    assert paired_difference({0: float("nan")}, {0: 4.0}).mean is None


def summary(cpu=None, isa=None, device="NVIDIA H100 80GB HBM3") -> dict:
    """A run's summary cut to its environment, without the CPU fields not given (a run recorded before them)."""
    env = {"device": device, "cpu": cpu, "cpu_isa": isa}
    return {"val_loss": 4.0, "environment": {k: v for k, v in env.items() if v is not None}}


def test_runs_pair_only_on_the_same_cpu_model_and_extensions():
    xeon_amx = summary("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512", "AMX"])
    assert same_cpu_type(xeon_amx, summary("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512", "AMX"]))
    # the same generic model name over other hardware, another model with the same extensions: not the same type
    assert not same_cpu_type(xeon_amx, summary("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512"]))
    assert not same_cpu_type(xeon_amx, summary("AMD EPYC 9654 96-Core Processor", ["AVX2", "AVX-512", "AMX"]))
    # the GPU does not decide it: the host's CPU does (it feeds the GPU)
    assert same_cpu_type(xeon_amx, summary("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512", "AMX"], device="cpu"))
    # a run that does not say (recorded before these fields) pairs with nothing, not even its own kind
    old = summary(device="Intel(R) Xeon(R) Processor")
    assert not same_cpu_type(old, old) and not same_cpu_type(xeon_amx, old) and not same_cpu_type(old, xeon_amx)
    no_extensions = summary("Some CPU", [])
    assert same_cpu_type(no_extensions, summary("Some CPU", [])) and not same_cpu_type({}, {})


def test_seeds_pair_only_across_runs_of_one_cpu_type_and_unrecorded_runs_pair_as_before():
    amx, avx2 = ("Intel(R) Xeon(R) Processor", ["AVX2", "AVX-512", "AMX"]), ("AMD EPYC 7B13", ["AVX2"])

    def run(seed, cpu=None, loss=4.0):
        return {**summary(*(cpu or (None, None))), "seed": seed, "val_loss": loss}
    baseline = [run(0, amx), run(1, amx), run(2, amx)]
    variant = [run(0, amx, 4.1), run(1, amx, 4.2), run(2, avx2, 3.0)]  # seed 2 ran elsewhere: left out
    pairs, left_out, unrecorded = pair_by_seed(variant, baseline)
    assert [(r["seed"], b["seed"]) for r, b in pairs] == [(0, 0), (1, 1)] and (left_out, unrecorded) == (1, False)
    # runs recorded before the CPU type was: paired as they always were, and said so; one recorded and one not: out
    pairs, left_out, unrecorded = pair_by_seed([run(0), run(1, amx)], [run(0), run(1)])
    assert [r["seed"] for r, _ in pairs] == [0] and (left_out, unrecorded) == (1, True)
    # in the report: the difference over the kept seeds, and what was left out
    groups = {("pre-rmsnorm", 8, 1e-3, 0): [{**r, "diverged": False, "plateaued": False} for r in baseline],
              ("pre-derf", 8, 1e-3, 0): [{**r, "diverged": False, "plateaued": False} for r in variant]}
    tuning = [{"variant": v, "depth": 8, "chosen_lr": 1e-3, "at_edge": False, "usable_range": [1e-3],
               "learning_rates": [1e-3]} for v in ("pre-rmsnorm", "pre-derf")]
    row = fair_table(groups, tuning, "pre-rmsnorm").splitlines()[-1]
    assert "| +0.150 ± 0.071 | 2/2 (1 across CPU types left out) |" in row
