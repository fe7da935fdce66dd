"""The fair study's rules (scripts/run_ablation.py --tune_lr, docs/results/fair.md): which lr a variant trains best
at, how wide its usable range is, and how it compares with a baseline seed by seed, from final validation losses."""

import math
import statistics
from dataclasses import dataclass

# A chosen lr at the edge of the grid may be beaten just outside it; the grid grows by this factor that many times.
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
    """One lr over the tune seeds: the mean of their losses, usable only if every seed is. A lr at which any seed
    diverged or plateaued cannot win, and choosing by the mean of several seeds keeps the choice from rewarding
    one seed's luck, which the same seed would then carry into the reported difference."""
    losses = [p.val_loss for p in seeds]
    mean = None if None in losses else statistics.mean(losses)
    return Point(lr, mean, mean is not None and all(p.usable for p in seeds))


def choose_lr(points: list[Point]) -> float | None:
    """The usable point with the lowest loss, on an exact tie the smaller (safer) lr; None when none is usable."""
    usable = [p for p in points if p.usable and p.val_loss is not None and math.isfinite(p.val_loss)]
    return min(usable, key=lambda p: (p.val_loss, p.lr)).lr if usable else None


def edge_extension(lrs: list[float], chosen: float | None) -> list[float]:
    """The lrs to add: ÷2 below the lowest when the choice is the lowest, ×2 above the highest when it is the
    highest, and both when nothing was chosen (too high an lr diverges or collapses to the unigram loss, too low a
    one can stall a norm whose signal starts small); none when the choice lies inside the grid."""
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
    return sorted(p.lr for p in points if p.usable and p.val_loss is not None and p.val_loss <= floor + USABLE_MARGIN)


@dataclass(frozen=True)
class PairedDifference:
    """Per-seed differences variant − baseline (negative: the variant reached a lower loss)."""
    differences: dict[int, float]

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.differences.values()) if self.differences else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.differences.values()) if len(self.differences) > 1 else None

    @property
    def agreeing(self) -> int:
        """How many seeds' differences have the sign of the mean (a zero difference agrees with nothing)."""
        mean = self.mean
        return sum(1 for d in self.differences.values() if d * mean > 0) if mean else 0


def paired_difference(losses: dict[int, float | None], baseline: dict[int, float | None]) -> PairedDifference:
    """Differences on the seeds both sides finished with a finite loss (same seed = same init and data order)."""
    seeds = sorted(s for s in losses.keys() & baseline.keys()
                   if all(v is not None and math.isfinite(v) for v in (losses[s], baseline[s])))
    return PairedDifference({s: losses[s] - baseline[s] for s in seeds})


def recorded_cpu(run: dict) -> bool:
    """Whether a run's summary records its CPU type (runs recorded before it was do not)."""
    return all(run.get("environment", {}).get(key) is not None for key in ("cpu", "cpu_isa"))


def same_cpu_type(run: dict, other: dict) -> bool:
    """Whether two runs ran on the same CPU model with the same vector and matrix extensions (AVX2, AVX-512, AMX;
    common/environment.py): only then do their times compare and can their float32 results agree to the bit. A
    model name alone is not enough, since virtual machines often report a generic one over different hardware."""
    a, b = run.get("environment", {}), other.get("environment", {})
    return recorded_cpu(run) and all(a[key] == b.get(key) for key in ("cpu", "cpu_isa"))


def pair_by_seed(runs: list[dict], baseline: list[dict]) -> tuple[list[tuple[dict, dict]], int, bool]:
    """The (run, baseline run) pairs of each seed both sides have, kept where both ran on the same CPU type or
    neither records it (such runs pair as they always did); with how many pairs were left out, and whether a kept
    pair's CPU type is unrecorded."""
    baseline_by_seed = {r["seed"]: r for r in baseline}
    pairs = [(r, baseline_by_seed[r["seed"]]) for r in runs if r["seed"] in baseline_by_seed]
    unrecorded = [not recorded_cpu(r) and not recorded_cpu(b) for r, b in pairs]
    kept = [(r, b) for (r, b), old in zip(pairs, unrecorded, strict=True) if old or same_cpu_type(r, b)]
    return kept, len(pairs) - len(kept), any(unrecorded)


def paired_runs(runs: list[dict], other: list[dict]) -> tuple[PairedDifference, int, bool]:
    """runs − other seed by seed, paired as pair_by_seed pairs them, a diverged or plateaued run counting as no
    loss; with pair_by_seed's count of pairs left out and whether a kept pair's CPU type is unrecorded."""
    pairs, left_out, unrecorded = pair_by_seed(runs, other)

    def losses(side: list[dict]) -> dict[int, float | None]:
        return {r["seed"]: None if r["diverged"] or r.get("plateaued") else r["val_loss"] for r in side}

    return paired_difference(losses([r for r, _ in pairs]), losses([o for _, o in pairs])), left_out, unrecorded
