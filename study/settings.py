"""A study's own flags checked and completed before anything trains: the variants (or 'all'), seeds, depths and
learning rates, each once, the flag combinations a study refuses, and the trainer flags its runs share."""

import math
import os
import sys
from argparse import Namespace

from common.cli import UserError
from model import NORM_TYPES
from study.variants import NAMED, PLACEMENT_DEFAULTS, PLACEMENTS, VARIANTS, variant_problem
from trainer.args import build_parser, fill_device_defaults

DEFAULT_BASELINE = "pre-rmsnorm"
MAX_SEED = 2**32 - 1  # numpy's seed range: a run's seed also draws its batch order
# Flags each run gets from the study, so passing them as trainer flags would be ignored or contradictory.
SET_PER_RUN = ("--seed", "--resume", "--overwrite", *(f"--{field}" for field in ("norm", *PLACEMENT_DEFAULTS)))


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
    if bad := [s for s in own.seeds if not 0 <= s <= MAX_SEED]:
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
    own.baseline = own.baseline or DEFAULT_BASELINE
    own.variants = without_repeats("--variants", variants)
    own.seeds = without_repeats("--seeds", own.seeds)
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
