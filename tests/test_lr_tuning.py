"""The fair-study protocol's arithmetic on hand-made results: the lr choice, the grid's growth, the usable
range, Student's t (the runner's --tune_lr end to end is in test_ablation.py)."""

import math

import pytest

from study.lr_tuning import (
    Point,
    choose_lr,
    edge_extension,
    grid_point,
    t_critical,
    t_two_sided_p,
    usable_range,
)


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
