"""The fair-study protocol's arithmetic: which learning rate a variant trains best at, how wide its usable range
is, and how it compares with a baseline seed by seed. Pure functions on final validation losses, so the runner
(study/runner.py, scripts/run_ablation.py --tune_lr), its report and the tests share them.

A grid point is *usable* when its run neither diverged (a non-finite loss, or a finite one that blew up) nor
plateaued (learned next to nothing): only usable points can win, because a run that plateaued at a low loss by
luck is not a setting anyone should pick.
"""

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
    """One grid point: the peak lr and its first seed's final validation loss (None when the run diverged)."""
    lr: float
    val_loss: float | None
    usable: bool


def choose_lr(points: list[Point]) -> float | None:
    """The usable point with the lowest final validation loss; on an exact tie the smaller lr (the safer setting).
    None when no point is usable."""
    usable = [p for p in points if p.usable and p.val_loss is not None and math.isfinite(p.val_loss)]
    if not usable:
        return None
    return min(usable, key=lambda p: (p.val_loss, p.lr)).lr


def edge_extension(lrs: list[float], chosen: float | None) -> float | None:
    """The lr to add when the chosen one sits at an edge of the grid (÷2 below the lowest, ×2 above the highest),
    or below the lowest when nothing was chosen: divergence and Post-Norm's collapse to the unigram loss are what
    an lr above a variant's ceiling does, so a grid where nothing trains looks lower. None when the choice lies
    inside the grid."""
    if len(lrs) < 2:
        return None
    if chosen is None or chosen == min(lrs):
        return min(lrs) / EDGE_FACTOR
    if chosen == max(lrs):
        return chosen * EDGE_FACTOR
    return None


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
        if not mean:
            return 0
        return sum(1 for d in self.differences.values() if d * mean > 0)


def paired_difference(losses: dict[int, float | None], baseline: dict[int, float | None]) -> PairedDifference:
    """Differences on the seeds both sides finished with a finite loss (same seed = same init and data order)."""
    seeds = sorted(s for s in losses.keys() & baseline.keys()
                   if losses[s] is not None and baseline[s] is not None
                   and math.isfinite(losses[s]) and math.isfinite(baseline[s]))
    return PairedDifference({s: losses[s] - baseline[s] for s in seeds})


def same_cpu_type(run: dict, other: dict) -> bool:
    """Whether two runs (their summaries) ran on the same type of CPU: the same model name and the same vector and
    matrix extensions (AVX2, AVX-512, AMX; common/environment.py records both). Only such runs' times compare,
    and only their float32 results can agree to the bit: other kernels run, and round differently. A model name
    alone is not enough, since virtual machines often report a generic one ('Intel(R) Xeon(R) Processor') over
    different hardware. False when either run does not say (recorded before the extensions were)."""
    a, b = run.get("environment", {}), other.get("environment", {})
    return all(a.get(key) is not None and a.get(key) == b.get(key) for key in ("cpu", "cpu_isa"))


def pair_by_seed(runs: list[dict], baseline: list[dict]) -> tuple[list[tuple[dict, dict]], int, bool]:
    """The (run, baseline run) pairs of each seed both sides have, kept only where the two ran on the same CPU
    type; runs recorded before the CPU type was (neither says) still pair, as they always did. Returns the kept
    pairs, how many were left out for running on different (or one unrecorded) CPU types, and whether any kept
    pair's CPU type is unrecorded."""
    baseline_by_seed = {r["seed"]: r for r in baseline}
    pairs = [(r, baseline_by_seed[r["seed"]]) for r in runs if r["seed"] in baseline_by_seed]
    unrecorded = [(r, b) for r, b in pairs if not recorded_cpu(r) and not recorded_cpu(b)]
    kept = [(r, b) for r, b in pairs if same_cpu_type(r, b) or (r, b) in unrecorded]
    return kept, len(pairs) - len(kept), bool(unrecorded)


def recorded_cpu(run: dict) -> bool:
    environment = run.get("environment", {})
    return environment.get("cpu") is not None and environment.get("cpu_isa") is not None


def paired_runs(runs: list[dict], other: list[dict]) -> tuple[PairedDifference, int, bool]:
    """runs − other seed by seed, paired as pair_by_seed pairs them, a diverged or plateaued run counting as no
    loss; with pair_by_seed's count of seeds left out and whether a kept pair's CPU type is unrecorded."""
    pairs, left_out, unrecorded = pair_by_seed(runs, other)

    def losses(side: list[dict]) -> dict[int, float | None]:
        return {r["seed"]: None if r["diverged"] or r.get("plateaued") else r["val_loss"] for r in side}

    return paired_difference(losses([r for r, _ in pairs]), losses([o for _, o in pairs])), left_out, unrecorded
