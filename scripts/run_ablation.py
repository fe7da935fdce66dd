"""Normalization ablation: the same training job for several variants, depths and seeds, then plots and a table.

    python scripts/run_ablation.py --out_dir out/ablation --seeds 0 1 2 --max_steps 300
    python scripts/run_ablation.py --variants all --seeds 0
    python scripts/run_ablation.py --variants pre-rmsnorm post-rmsnorm deepnorm-rmsnorm --depths 8 16 32
    python scripts/run_ablation.py --learning_rates 1e-3 3e-3 1e-2 --warmup_steps 0 50   # stability grid
    python scripts/run_ablation.py --tune_lr 2e-3 4e-3 8e-3 1.6e-2 --seeds 0 1 2 3 4     # fair study
    torchrun --nproc_per_node 8 scripts/run_ablation.py --tune_lr 1e-3 2e-3 4e-3 --seeds 0 1 2 3 4   # 8 runs at a time

Every run goes through trainer.train_pretrain.train (as `python trainer/train_pretrain.py` does), with the same
data, seeds and step budget; any trainer flag passes through. A variant is <placement>-<norm>, e.g. pre-rmsnorm,
post-layernorm, pre+qk_head-rmsnorm (PLACEMENTS in study/variants.py). Finished runs are reused when the study runs
again with the same out_dir, so an interrupted study picks up where it stopped.

--tune_lr compares every (variant, depth) at its own best peak lr: the tune seeds (the first two of --seeds) train at
each grid point, the lowest mean final validation loss of an lr at which no tune seed diverged or plateaued wins (the
grid grows past a winning edge, both ways when nothing trains), then the other seeds train at that lr, fresh seeds
for the differences the report gives; tuning.json, lr_sensitivity.png and results.md's paired differences against
--baseline report it (docs/results/fair.md, study/lr_tuning.py). Under torchrun the ranks train whole runs side by
side (--parallel runs) or each run in turn across all ranks (--parallel data); rank 0 writes the report (docs/gpu.md).
"""

import math
import os
import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, require_writable_dir, run_cli
from model import NORM_TYPES
from study.parallel import Worker, require_locks
from study.report import report
from study.runner import StudyInterrupted, tokenize_once, train_study
from study.variants import NAMED, PLACEMENT_DEFAULTS, PLACEMENTS, VARIANTS, variant_problem
from trainer.args import build_parser, fill_device_defaults

DEFAULT_VARIANTS = ["pre-rmsnorm", "pre-layernorm", "post-rmsnorm", "post-layernorm"]
DEFAULT_BASELINE = "pre-rmsnorm"
MAX_SEED = 2**32 - 1  # numpy's seed range: a run's seed also draws its batch order
# Flags each run gets from the study, so passing them as trainer flags would be ignored or contradictory.
SET_PER_RUN = ("--seed", "--resume", "--overwrite", *(f"--{field}" for field in ("norm", *PLACEMENT_DEFAULTS)))


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__,
                       epilog="All other flags are trainer flags (see python trainer/train_pretrain.py --help).")
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS,
                   help=f"<placement>-<norm> names, the whole names {' '.join(NAMED)}, or 'all' for every variant "
                        f"that makes a model (not, e.g., hybrid-none: HybridNorm's q, k and v norms need a norm "
                        f"type); placements: {' '.join(PLACEMENTS)}; norms: {' '.join(sorted(NORM_TYPES))}")
    p.add_argument("--seeds", nargs="+", type=int, default=[0],
                   help=f"each variant runs once per seed, in [0, {MAX_SEED}]")
    p.add_argument("--depths", nargs="+", type=int, default=None,
                   help="depth study: numbers of blocks, one run per depth (default: the trainer's "
                        "--num_hidden_layers)")
    p.add_argument("--learning_rates", nargs="+", type=float, default=None,
                   help="stability grid: peak learning rates (default: the trainer's --learning_rate)")
    p.add_argument("--warmup_steps", nargs="+", type=int, default=None,
                   help="stability grid: warmup lengths (default: the trainer's --warmup_steps)")
    p.add_argument("--tune_lr", nargs="+", type=float, default=None, metavar="LR",
                   help="fair study: peak learning rates to sweep per variant and depth with the first seed; the "
                        "other seeds train only at the lr with the lowest final validation loss (see above)")
    p.add_argument("--tune_seeds", nargs="+", type=int, default=None,
                   help="with --tune_lr: the seeds that train every grid point; the lr is chosen by their mean "
                        "(default: the first two of --seeds)")
    p.add_argument("--tune_lr_for", nargs="+", default=[], type=variant_grid, metavar="VARIANT=LR,LR,...",
                   help="with --tune_lr: a variant's own starting grid, e.g. post-rmsnorm=5e-4,1e-3,2e-3")
    p.add_argument("--report_only", action="store_true",
                   help="write the report from the finished runs and train nothing; it lists what is left")
    p.add_argument("--baseline", default=None,
                   help=f"with --tune_lr: the variant every other one is compared with, seed by seed, at the same "
                        f"depth; when given, one of --variants (default: {DEFAULT_BASELINE}, compared with when it "
                        "is one of --variants)")
    p.add_argument("--out_dir", default="out/ablation", help="study folder: runs/, plots, results.md")
    p.add_argument("--parallel", choices=("runs", "data"), default="runs",
                   help="under torchrun: runs, each rank trains whole runs of the study side by side, alone on its own "
                        "GPU (or its share of the CPU cores), each as the study without torchrun would; data, every "
                        "run in turn across all ranks with data parallelism (DDP), for a model too big for one "
                        "device. Without torchrun nothing changes")
    return study_settings(*p.parse_known_args(argv))


def variant_grid(text: str) -> tuple[str, list[float]]:
    """'post-rmsnorm=5e-4,1e-3' -> ('post-rmsnorm', [0.0005, 0.001])."""
    variant, _, lrs = text.partition("=")
    return variant, [float(lr) for lr in lrs.split(",")]


def study_settings(own: Namespace, rest: list[str]) -> tuple[Namespace, Namespace]:
    """The study's settings from its own flags (own, as parsed) and the trainer flags every run shares (rest, the
    arguments the study's parser left); a UserError names what is refused."""
    variants = [v for v in VARIANTS if not variant_problem(v)] if own.variants == ["all"] else own.variants
    for v in variants:
        if v not in VARIANTS:
            raise UserError(f"unknown variant {v!r}: a variant is <placement>-<norm> with placement one of "
                            f"{', '.join(PLACEMENTS)} and norm one of {', '.join(sorted(NORM_TYPES))}; or one of "
                            f"{', '.join(NAMED)}; or 'all'")
        if problem := variant_problem(v):
            raise UserError(f"variant {v!r} makes no model ({problem}); pair its placement with another norm "
                            "('all' runs every variant that makes one)")
    if own.baseline is not None and own.baseline not in variants:
        raise UserError(f"--baseline {own.baseline!r} is not one of --variants; choose one of {', '.join(variants)}")
    if bad := [s for s in own.seeds + (own.tune_seeds or []) if not 0 <= s <= MAX_SEED]:
        raise UserError(f"--seeds must be in [0, {MAX_SEED}] (numpy's seed range), got {' '.join(map(str, bad))}")
    trainer_args = fill_device_defaults(build_parser().parse_args(rest))
    if set(SET_PER_RUN) & {a.split("=")[0] for a in rest}:
        raise UserError(f"{', '.join(SET_PER_RUN)} are set per run by the study; use --seeds and --variants "
                        "(finished runs are reused automatically)")
    if own.tune_lr is not None:
        if own.learning_rates is not None:
            raise UserError("--tune_lr picks each variant's learning rate itself; drop --learning_rates (a fixed "
                            "grid for every variant) or --tune_lr")
        if own.warmup_steps is not None and len(own.warmup_steps) > 1:
            raise UserError("--tune_lr takes one --warmup_steps value; run one study per warmup")
        if not all(math.isfinite(lr) and lr > 0 for lr in own.tune_lr):
            raise UserError(f"--tune_lr learning rates must be finite and > 0, got {own.tune_lr}")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and own.parallel == "data":
            raise UserError("--tune_lr with --parallel data would train each grid point across all ranks, one after "
                            "another; use --parallel runs (the default), which trains the grid's runs side by side")
        own.tune_lr = sorted(set(own.tune_lr))
        own.tune_lr_for = dict(own.tune_lr_for)
        if bad := [v for v, lrs in own.tune_lr_for.items()
                   if v not in variants or not lrs or not all(math.isfinite(lr) and lr > 0 for lr in lrs)]:
            raise UserError(f"--tune_lr_for {' '.join(bad)}: each must name one of --variants with lrs > 0")
    elif own.tune_lr_for or own.tune_seeds:
        raise UserError("--tune_lr_for and --tune_seeds go with --tune_lr")
    own.baseline = own.baseline or DEFAULT_BASELINE
    own.variants = without_repeats("--variants", variants)
    own.seeds = without_repeats("--seeds", own.seeds)
    own.tune_seeds = without_repeats("--tune_seeds", own.tune_seeds or own.seeds[:2])
    own.depths = without_repeats("--depths", own.depths or [trainer_args.num_hidden_layers])
    own.learning_rates = without_repeats("--learning_rates", own.learning_rates or [trainer_args.learning_rate])
    own.warmup_steps = without_repeats("--warmup_steps", own.warmup_steps or [trainer_args.warmup_steps])
    if any(d < 1 for d in own.depths):
        raise UserError(f"--depths must be positive integers, got {own.depths}")
    if not all(math.isfinite(lr) and lr > 0 for lr in own.learning_rates) or any(w < 0 for w in own.warmup_steps):
        raise UserError("--learning_rates must be finite and > 0, and --warmup_steps >= 0")
    return own, trainer_args


def without_repeats(flag: str, values: list) -> list:
    """values without repeats, in the order given: a repeated seed or variant names the same run, which counted
    once per mention would weigh more than the others in every mean, spread and count."""
    kept = list(dict.fromkeys(values))
    if len(kept) < len(values):
        repeated = [str(v) for v in kept if values.count(v) > 1]
        print(f"note: {flag} repeats {', '.join(repeated)}; each runs and counts once", file=sys.stderr)
    return kept


def main(argv: list[str] | None = None) -> None:
    study, base = parse_args(argv)
    worker = Worker.from_environment()
    runs_side_by_side = worker.world_size > 1 and study.parallel == "runs"
    if runs_side_by_side:
        worker.own_share(base)
        claims = Path(study.out_dir) / ".claims"
        require_writable_dir("--out_dir", Path(study.out_dir))
        require_locks(claims)
        tokenize_once(base, claims)
    try:
        plan = train_study(study, base, worker)
    except StudyInterrupted:
        print("study interrupted; run the same command again to continue where it stopped")
        return
    if runs_side_by_side and worker.rank != 0:
        return  # rank 0 writes the report, once every rank's runs are finished
    if plan.groups or plan.tuning:
        report(study, base, plan.groups, plan.tuning)


if __name__ == "__main__":
    run_cli(main)
