"""The fair study's rules (scripts/run_ablation.py --tune_lr, docs/results/fair.md): which lr a variant trains
best at and how wide its usable range is, from final validation losses; and Student's t, which the claims'
rule (study/claims.py) uses."""

import math
import statistics
from dataclasses import dataclass

# A chosen lr at the edge of the grid may be beaten just outside it; the grid grows by this factor that many
# times.
EDGE_FACTOR = 2.0
MAX_EXTENSIONS = 2
# Grid points whose loss is within this many nats of the variant's best count as its usable lr range.
USABLE_MARGIN = 0.05


@dataclass(frozen=True)
class Point:
    """One grid point: the peak lr, its final validation loss (None when a run diverged), and whether it is
    usable: a run that plateaued at a low loss by luck is not a setting anyone should pick."""
    lr: float
    val_loss: float | None
    usable: bool


def grid_point(lr: float, seeds: list[Point]) -> Point:
    """One lr over the tune seeds: the mean of their losses, usable only if every seed is. A lr at which any
    seed diverged or plateaued cannot win, and choosing by the mean of several seeds keeps the choice from
    rewarding one seed's luck, which the same seed would then carry into the reported difference."""
    losses = [p.val_loss for p in seeds]
    mean = None if None in losses else statistics.mean(losses)
    return Point(lr, mean, mean is not None and all(p.usable for p in seeds))


def choose_lr(points: list[Point]) -> float | None:
    """The usable point with the lowest loss, on an exact tie the smaller (safer) lr; None when none is
    usable."""
    usable = [p for p in points if p.usable and p.val_loss is not None and math.isfinite(p.val_loss)]
    return min(usable, key=lambda p: (p.val_loss, p.lr)).lr if usable else None


def edge_extension(lrs: list[float], chosen: float | None) -> list[float]:
    """The lrs to add: ÷2 below the lowest when the choice is the lowest, ×2 above the highest when it is the
    highest, and both when nothing was chosen (too high an lr diverges or collapses to the unigram loss, too
    low a one can stall a norm whose signal starts small); none when the choice lies inside the grid."""
    if len(lrs) < 2:
        return []
    below, above = min(lrs) / EDGE_FACTOR, max(lrs) * EDGE_FACTOR
    if chosen is None:
        return [below, above]
    return [below] if chosen == min(lrs) else [above] if chosen == max(lrs) else []


def usable_range(points: list[Point]) -> list[float]:
    """The usable grid points within USABLE_MARGIN nats of the best one, in increasing lr."""
    best = choose_lr(points)
    if best is None:
        return []
    floor = next(p.val_loss for p in points if p.lr == best)
    return sorted(p.lr for p in points
                  if p.usable and p.val_loss is not None and p.val_loss <= floor + USABLE_MARGIN)


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with an integer df ≥ 1, in closed form (Abramowitz & Stegun 26.7.3-4):
    exact, no scipy, and all a paired test needs (df = n − 1). p below ~1e-16 is lost to the subtraction."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    for k in range(1, (df - 1) // 2 if df % 2 else df // 2):  # the series' terms beyond the first
        term *= (2 * k / (2 * k + 1) if df % 2 else (2 * k - 1) / (2 * k)) * c2
        total += term
    inside = (2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total * (df > 1)) if df % 2
              else math.sin(theta) * total)
    return max(0.0, 1.0 - inside)


def t_critical(confidence: float, df: int) -> float:
    """The t ≥ 0 with P(|T| ≥ t) = 1 − confidence, by bisection (p falls as t grows: it cannot miss)."""
    low, high = 0.0, 1e7  # beyond any t asked for: 3.2e4 at df 1 for 99.999%
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_p(middle, df) > 1 - confidence else (low, middle)
    return (low + high) / 2
