"""Normalization ablation: the same training job for several variants, depths and seeds, then plots and a table.

    python scripts/run_ablation.py --out_dir out/ablation --seeds 0 1 2 --max_steps 300
    python scripts/run_ablation.py --variants all --seeds 0
    python scripts/run_ablation.py --variants pre-rmsnorm post-rmsnorm deepnorm-rmsnorm --depths 8 16 32
    python scripts/run_ablation.py --learning_rates 1e-3 3e-3 1e-2 --warmup_steps 0 50   # stability grid
    python scripts/run_ablation.py --tune_lr 1e-3 2e-3 4e-3 8e-3 1.6e-2 --seeds 0 1 2     # fair study
    torchrun --nproc_per_node 8 scripts/run_ablation.py --tune_lr 1e-3 2e-3 4e-3 --seeds 0 1 2   # 8 runs at a time

Every run goes through trainer.train_pretrain.train (the same code as `python trainer/train_pretrain.py`),
with identical data, seed list and step budget; any trainer flag passes through. A variant is
<placement>-<norm>, e.g. pre-rmsnorm, post-layernorm, pre+qk_head-rmsnorm, reorder+qk_proj-rmsnorm: a named
placement from PLACEMENTS in study/variants.py (the config fields it sets) and a norm type. Finished runs are
reused when the study is re-run with the same out_dir, so an interrupted study picks up where it stopped.

With --tune_lr every (variant, depth) is compared at its own best peak learning rate: the first seed trains at
each grid point, the lowest final validation loss among runs that neither diverged nor plateaued wins (the grid
grows by one point past an edge that wins, or below its lowest lr when nothing trains, at most twice), and only
then do the other seeds train, at that lr.
The choice is written to tuning.json and lr_sensitivity.png; results.md compares the variants at their chosen lrs,
with paired per-seed differences against --baseline (trainer/lr_tuning.py has the rules).

Under torchrun (--parallel runs, the default) the ranks train whole runs side by side, each alone on its own GPU or
its share of the CPU cores, each run exactly as above; across nodes too (--nnodes, with an --out_dir all of them
share). A rank takes the next run no other rank holds; with --tune_lr, grid runs go out first and a variant's other
seeds once its choice is made (study/parallel.py). Rank 0 writes the report. --parallel data trains every run in
turn across all ranks instead (data parallelism), for a model too big for one device.
"""

import copy
import json
import math
import os
import socket
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from common.cli import ArgumentParser, UserError, require_writable_dir, run_cli
from common.environment import describe, environment
from data import load_tokenizer, prepare_split
from model import NORM_TYPES
from study.parallel import Worker, require_locks, train_in_parallel, waiting_claim
from study.variants import NAMED, PLACEMENT_DEFAULTS, PLACEMENTS, VARIANTS, variant_problem
from trainer import lr_tuning
from trainer.args import build_parser, fill_device_defaults, flags_with, validate
from trainer.checkpoint import find_checkpoints
from trainer.plots import plot_depth, plot_grid, plot_layer_profiles, plot_loss_curves, plot_lr_sensitivity
from trainer.run_dir import recorded_value
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

DEFAULT_VARIANTS = ["pre-rmsnorm", "pre-layernorm", "post-rmsnorm", "post-layernorm"]
DEFAULT_BASELINE = "pre-rmsnorm"
MAX_SEED = 2**32 - 1  # numpy's seed range: a run's seed also draws its batch order
# Flags each run gets from the study, so passing them as trainer flags would be ignored or contradictory.
SET_PER_RUN = ("--seed", "--resume", "--overwrite", *(f"--{field}" for field in ("norm", *PLACEMENT_DEFAULTS)))

# A run "plateaued" when it trained without diverging but learned (almost) nothing: its final validation loss is
# within PLATEAU_MARGIN nats of what a context-free unigram model scores on the validation split, or no lower
# than its first validation loss (with at least two evaluations).
PLATEAU_MARGIN = 0.05


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
    p.add_argument("--baseline", default=None,
                   help=f"with --tune_lr: the variant every other one is compared with, seed by seed, at the same "
                        f"depth; when given, one of --variants (default: {DEFAULT_BASELINE}, compared with when it "
                        "is one of --variants)")
    p.add_argument("--out_dir", default="out/ablation", help="study folder: runs/, plots, results.md")
    p.add_argument("--parallel", choices=("runs", "data"), default="runs",
                   help="under torchrun: runs, each rank trains whole runs of the study side by side, alone on its own "
                        "GPU (or its share of the CPU cores), each as the study without torchrun would; data, every "
                        "run in turn across all ranks with data parallelism (DDP), for a model too big for one "
                        "device. Without torchrun nothing changes (default: runs)")
    own, rest = p.parse_known_args(argv)
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


def run_name(variant: str, depth: int, lr: float, warmup: int, seed: int) -> str:
    return f"{variant}-L{depth}-lr{lr:g}-wu{warmup}-s{seed}"


# Flags that do not change what a run computes (their role in trainer/args.py), so a finished run made with other
# values is still valid.
BOOKKEEPING = set(flags_with("bookkeeping"))


def run_args(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int, job: str = "run"):
    """The trainer flags of one run of the study. job: what the run is to the study, for its wandb tags
    (trainer/args.py WANDB_JOBS)."""
    name = run_name(variant, depth, lr, warmup, seed)
    out_dir = Path(study.out_dir) / "runs" / name
    args = copy.copy(base)
    for field, value in VARIANTS[variant].items():
        setattr(args, field, value)
    args.num_hidden_layers, args.seed = depth, seed
    args.learning_rate, args.warmup_steps = lr, warmup
    args.min_lr = min(base.min_lr, lr)
    # A run with a checkpoint continues; one without starts afresh over whatever a crash before its first
    # checkpoint left in its folder (this study's own, named after the run).
    args.out_dir, args.resume = str(out_dir), bool(find_checkpoints(out_dir))
    args.overwrite = not args.resume
    args.wandb_group = base.wandb_group or Path(study.out_dir).name
    args.wandb_run_name, args.wandb_job = name, job
    return args


def finished_run(base, study, *run) -> dict | None:
    """The summary of a run of the study that is finished (trained to --max_steps, or diverged), with out_dir where
    it is now, wherever the study ran from then; None if it is not."""
    args = run_args(base, study, *run)
    out_dir = Path(args.out_dir)
    if not (out_dir / "summary.json").exists():
        return None
    summary = json.loads((out_dir / "summary.json").read_text())
    changed = sorted(k for k, v in vars(args).items()
                     if k not in BOOKKEEPING and recorded_value(summary.get("args", {}), k) != v)
    if changed:
        raise UserError(f"{out_dir} was trained with other values of --{', --'.join(changed)}; "
                        "use a new --out_dir for a different study")
    ranks = int(os.environ.get("WORLD_SIZE", "1"))  # what each run trains on: 1 with --parallel runs
    if summary.get("world_size", ranks) != ranks:  # (summaries from before it was recorded do not say)
        raise UserError(f"{out_dir} was trained on {summary['world_size']} data-parallel ranks, this study "
                        f"trains each run on {ranks}: its batches differ; use a new --out_dir, or the same "
                        "--parallel mode and number of ranks")
    if not (summary["diverged"] or summary["step"] >= base.max_steps):
        return None
    if not (out_dir / "metrics.jsonl").is_file():  # the plateau rule and the figures read it
        raise UserError(f"{out_dir} is finished but its metrics.jsonl is missing; restore it, or delete "
                        "the run's folder to train it again")
    return {**summary, "out_dir": str(out_dir)}


def run_one(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int, job: str = "run") -> dict:
    """Train one configuration (or reuse its finished result) and return its summary."""
    if (summary := finished_run(base, study, variant, depth, lr, warmup, seed)) is not None:
        return summary
    args = run_args(base, study, variant, depth, lr, warmup, seed, job)
    print(f"\n=== {args.wandb_run_name}")
    summary = train(validate(args))
    if summary["diverged"]:  # a finished run ends in the trainer's own closing line; a diverged one in this
        print(f"diverged: {summary['divergence']}; the study records it and goes on")
    return summary


def train_or_reuse(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int,
                   job: str = "run") -> dict | None:
    """run_one, stopping the study when the run was interrupted. None on DDP ranks other than 0 (they only get
    the outcome, not the numbers)."""
    summary = run_one(base, study, variant, depth, lr, warmup, seed, job)
    if summary["interrupted"]:
        raise StudyInterrupted
    return summary if "out_dir" in summary else None


def unigram_loss(base) -> float:
    """Validation loss (nats per token) of the best context-free model: every token predicted with its frequency
    in the training split, add-one smoothed so a token unseen in training costs a finite amount."""
    tokenizer = load_tokenizer(base.tokenizer_path)
    train_split, val_split = (prepare_split(base.data_path, split, tokenizer, base.text_field, num_proc=base.num_proc,
                                            streaming=base.streaming) for split in ("train", "validation"))
    counts = np.bincount(train_split.tokens, minlength=len(tokenizer)) + 1.0
    return float(-np.log(counts / counts.sum())[val_split.tokens].mean())


def plateaued(run: dict, metrics: list[dict], unigram: float) -> bool:
    """See PLATEAU_MARGIN."""
    if run["diverged"] or run["val_loss"] is None:
        return False
    evals = [r["loss"] for r in metrics if r["split"] == "val"]
    return run["val_loss"] > unigram - PLATEAU_MARGIN or (len(evals) > 1 and run["val_loss"] >= evals[0])


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def speed(runs: list[dict]) -> tuple[str, str]:
    """Mean tokens/s and s/step of the runs that timed a step (a one-step run has only its warm-up step)."""
    timed = [r for r in runs if r["tokens_per_s"] is not None]
    if not timed:
        return "—", "—"
    return (f"{statistics.mean(r['tokens_per_s'] for r in timed):.0f}",
            f"{statistics.mean(r['s_per_step'] for r in timed):.3f}")


def results_table(groups: dict[tuple, list[dict]], grid: bool) -> str:
    head = ["variant", "layers", *(["lr", "warmup"] if grid else []), "val loss", "val bpb", "tokens/s", "s/step",
            "norm params", "diverged", "plateaued"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (variant, depth, lr, warmup), runs in groups.items():
        ok = [r for r in runs if not r["diverged"] and r["val_loss"] is not None]
        row = [variant, str(depth), *([f"{lr:g}", str(warmup)] if grid else []),
               mean_std([r["val_loss"] for r in ok]), mean_std([r["val_bpb"] for r in ok]),
               *speed(ok),
               f"{runs[0]['norm_params']:,}", f"{sum(r['diverged'] for r in runs)}/{len(runs)}",
               f"{sum(r['plateaued'] for r in runs)}/{len(runs)}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def fair_table(groups: dict[tuple, list[dict]], tuning: list[dict], baseline: str) -> str:
    """--tune_lr: each (variant, depth) at its chosen lr, with its usable range and the paired difference."""
    head = ["variant", "layers", "chosen lr", f"usable lrs (≤ {lr_tuning.USABLE_MARGIN} nats from best)",
            "val loss", "min–max", f"Δ vs {baseline} (paired)", "seeds agreeing", "diverged", "plateaued"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs_at = {(variant, depth): runs for (variant, depth, _, _), runs in groups.items()}

    def seed_losses(runs):
        return {r["seed"]: None if r["diverged"] or r["plateaued"] else r["val_loss"] for r in runs}

    def pairing_note(left_out: int, unrecorded: bool) -> str:
        notes = [f"{left_out} across CPU types left out"] * bool(left_out) + ["CPU type not recorded"] * unrecorded
        return f" ({'; '.join(notes)})" if notes else ""

    for t in tuning:
        runs = runs_at.get((t["variant"], t["depth"]), [])
        ok = [r["val_loss"] for r in runs if not r["diverged"] and r["val_loss"] is not None]
        usable = t["usable_range"]
        span = (f"{min(usable):g}–{max(usable):g}" if len(usable) > 1 else f"{usable[0]:g}") if usable else "—"
        diff, agree = "—", "—"
        base_runs = runs_at.get((baseline, t["depth"]))
        if runs and base_runs and t["variant"] != baseline:
            pairs, left_out, unrecorded = lr_tuning.pair_by_seed(runs, base_runs)
            d = lr_tuning.paired_difference(seed_losses([r for r, _ in pairs]), seed_losses([b for _, b in pairs]))
            if d.differences:
                diff = f"{d.mean:+.3f}" + (f" ± {d.std:.3f}" if d.std is not None else "")
            if d.differences or left_out:
                agree = f"{d.agreeing}/{len(d.differences)}" + pairing_note(left_out, unrecorded)
        edge = " (edge)" if t["at_edge"] else ""
        row = [t["variant"], str(t["depth"]),
               f"{t['chosen_lr']:g}{edge}" if t["chosen_lr"] is not None else "none usable",
               f"{span} ({len(usable)} of {len(t['learning_rates'])})", mean_std(ok),
               f"{min(ok):.3f}–{max(ok):.3f}" if ok else "—", diff, agree,
               f"{sum(r['diverged'] for r in runs)}/{len(runs)}", f"{sum(r['plateaued'] for r in runs)}/{len(runs)}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def study_cost(out: Path) -> str:
    """How much training the study folder holds: finished runs and their summed training time."""
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/summary.json"))]
    hours = sum(r["train_time_s"] + r.get("compile_time_s", 0.0) for r in runs) / 3600
    return (f"The study folder holds {len(runs)} finished runs, {hours:.1f} hours of training in all (each run's "
            "train_time_s plus its warm-up step), evaluation and start-up not counted.")


def report(study, base, groups: dict[tuple, list[dict]], tuning: list[dict] | None = None) -> None:
    out = Path(study.out_dir)
    grid = len(study.learning_rates) > 1 or len(study.warmup_steps) > 1
    with_lr = grid or tuning is not None
    metrics = {key: [read_metrics(Path(r["out_dir"]) / "metrics.jsonl") for r in runs] for key, runs in groups.items()}
    unigram = unigram_loss(base)
    for key, runs in groups.items():
        for run, records in zip(runs, metrics[key], strict=True):
            run["plateaued"] = plateaued(run, records, unigram)

    def label(variant, depth, lr, warmup, with_depth=True):
        return " ".join([variant, *([f"L{depth}"] if with_depth and len(study.depths) > 1 else []),
                         *([f"lr={lr:g} wu={warmup}"] if grid else [])])  # tuned: one lr per variant

    plot_loss_curves({label(*k): m for k, m in metrics.items()}, out / "loss_curves.png")
    plot_layer_profiles({label(*k): m[0] for k, m in metrics.items()
                         if any(r["split"] == "train" for r in m[0])}, out / "layers.png")
    text = ["# Normalization ablation", "", describe(environment()) + " Each run's own is in results.json.", "",
            f"Seeds: {study.seeds}. Values are mean ± std over seeds of the final "
            "validation evaluation; a diverged run (non-finite loss, or a finite one that blew up; docs/training.md) is "
            "excluded from the mean and counted. A run "
            f"plateaued when its final validation loss is within {PLATEAU_MARGIN} nats of a unigram model's "
            f"({unigram:.3f}: training-split token frequencies, scored on the validation split) or no lower than "
            "at its first evaluation.", ""]
    if tuning is not None:
        (out / "tuning.json").write_text(json.dumps(tuning, indent=1))
        plot_lr_sensitivity(tuning, out / "lr_sensitivity.png")
        text += ["## Each variant at its own best learning rate", "",
                 f"Learning rates tried with seed {study.seeds[0]}: {' '.join(f'{lr:g}' for lr in study.tune_lr)} "
                 f"(the grid grows by ×2 or ÷2 past an edge that wins, or ÷2 below it when no lr trains, at most "
                 f"{lr_tuning.MAX_EXTENSIONS} times; "
                 "'(edge)' marks a choice still at the edge). The chosen lr has the lowest final validation loss among runs "
                 "that neither diverged nor plateaued; the other seeds trained at it only. Δ is the variant's "
                 f"final validation loss minus {study.baseline}'s on the same seed (same initialization seed and "
                 "data order), mean ± std over seeds; 'seeds agreeing' counts the seeds whose difference has "
                 "the sign of the mean. A seed pairs only where both runs ran on the same CPU type (model and "
                 "AVX2 / AVX-512 / AMX, from each run's summary): other kernels round differently, by as much as "
                 "the smallest effects here; runs recorded before the CPU type was pair as before, and say so.", "", study_cost(out), "", fair_table(groups, tuning, study.baseline), "",
                 "![lr sensitivity](lr_sensitivity.png)", ""]
    text += [results_table(groups, with_lr), ""]
    if len(study.depths) > 1:
        lines: dict[str, list[tuple[int, list[dict]]]] = {}
        for (variant, depth, lr, warmup), runs in groups.items():
            lines.setdefault(label(variant, depth, lr, warmup, with_depth=False), []).append((depth, runs))
        plot_depth(lines, out / "depth.png", unigram)
        text += ["## Depth (final val loss, mean and min..max over seeds)", "", "![depth](depth.png)", ""]
    if grid:
        text += ["## Stability grid (final val loss, mean over seeds; X = a seed diverged)", ""]
        for variant in study.variants:
            for depth in study.depths:
                values = np.array([[np.nan if any(r["diverged"] or r["val_loss"] is None
                                                  for r in groups[variant, depth, lr, w])
                                    else statistics.mean(r["val_loss"] for r in groups[variant, depth, lr, w])
                                    for w in study.warmup_steps] for lr in study.learning_rates])
                name = f"{variant}-L{depth}"
                plot_grid(values, [f"lr {lr:g}" for lr in study.learning_rates],
                          [f"warmup {w}" for w in study.warmup_steps], out / f"grid-{name}.png", name)
                text.append(f"![{name}](grid-{name}.png)")
        text.append("")
    text += ["![loss curves](loss_curves.png)", "", "![per-layer](layers.png)", ""]
    (out / "results.md").write_text("\n".join(text))
    rows = [{"variant": variant, "depth": depth, **r} for (variant, depth, _, _), runs in groups.items() for r in runs]
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    fair = "" if tuning is None else fair_table(groups, tuning, study.baseline) + "\n\n"
    print("\n" + fair + results_table(groups, with_lr) + f"\n\nwrote {out / 'results.md'}")


def tuning_point(lr: float, run: dict, unigram: float) -> lr_tuning.Point:
    """A finished run as a grid point: its final validation loss, usable unless it diverged or plateaued."""
    finite = not run["diverged"] and run["val_loss"] is not None and math.isfinite(run["val_loss"])
    usable = finite and not plateaued(run, read_metrics(Path(run["out_dir"]) / "metrics.jsonl"), unigram)
    return lr_tuning.Point(lr, run["val_loss"] if finite else None, usable)


class StudyInterrupted(Exception):
    """A run stopped on a signal; the same command continues the study where it stopped."""


# One run of a study: (variant, depth, lr, warmup, seed).
Run = tuple[str, int, float, int, int]


@dataclass
class Plan:
    """Where a study stands, from its finished runs: those that can train now, in the order they go out, each with
    its job (trainer/args.py WANDB_JOBS); the groups of finished runs the report compares; and with --tune_lr the
    choice of every (variant, depth) made so far."""
    pending: dict[Run, str]
    groups: dict[tuple, list[dict]]
    tuning: list[dict] | None = None


def grid_plan(study, results: dict[Run, dict | None]) -> Plan:
    """Every variant at every depth, lr, warmup and seed. A None result is a run this DDP rank took part in."""
    runs = [(variant, depth, lr, warmup, seed) for depth in study.depths for lr in study.learning_rates
            for warmup in study.warmup_steps for variant in study.variants for seed in study.seeds]
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        if results.get(run) is not None:
            groups.setdefault(run[:4], []).append(results[run])
    return Plan({run: "run" for run in runs if run not in results}, groups)


def tune_plan(study, results: dict[Run, dict], point, say) -> Plan:
    """--tune_lr: per (variant, depth), the lr grid with the first seed (grown past a winning edge, or downwards
    when nothing trains); once all its grid runs are finished, the choice, then the other seeds at the chosen lr
    only. Grid runs go out before other seeds, so no rank idles while a grid still has runs to train. point(run)
    is a finished run as a grid point; say(message) tells a decision once."""
    warmup, first = study.warmup_steps[0], study.seeds[0]
    grid_runs: dict[Run, str] = {}
    seed_runs: dict[Run, str] = {}
    groups: dict[tuple, list[dict]] = {}
    tuning = []
    for depth in study.depths:
        for variant in study.variants:
            lrs = list(study.tune_lr)
            for extension in range(lr_tuning.MAX_EXTENSIONS + 1):
                missing = [(variant, depth, lr, warmup, first) for lr in lrs
                           if (variant, depth, lr, warmup, first) not in results]
                if missing:
                    break
                points = [point((variant, depth, lr, warmup, first)) for lr in lrs]
                chosen = lr_tuning.choose_lr(points)
                new = lr_tuning.edge_extension(lrs, chosen)
                if new is None:
                    break
                if extension == lr_tuning.MAX_EXTENSIONS:
                    if chosen is not None:
                        say(f"{variant} L{depth}: the best lr, {chosen:g}, is still at the edge of the grid after "
                            f"{lr_tuning.MAX_EXTENSIONS} extensions; it is kept, but a better one may lie outside")
                    break
                why = (f"the best lr, {chosen:g}, is at the edge of the grid" if chosen is not None
                       else "no lr of the grid trained without diverging or plateauing")
                say(f"{variant} L{depth}: {why}; adding {new:g} (extension {extension + 1} of "
                    f"{lr_tuning.MAX_EXTENSIONS})")
                lrs = sorted([*lrs, new])
            if missing:
                grid_runs.update(dict.fromkeys(missing, "grid"))
                continue
            tuning.append({"variant": variant, "depth": depth, "learning_rates": lrs,
                           "val_losses": [p.val_loss for p in points], "usable": [p.usable for p in points],
                           "chosen_lr": chosen, "at_edge": chosen is not None and new is not None,
                           "usable_range": lr_tuning.usable_range(points)})
            if chosen is None:
                say(f"{variant} L{depth}: no lr of {', '.join(f'{lr:g}' for lr in lrs)} trained without "
                    "diverging or plateauing; its other seeds are not trained")
                continue
            runs = [(variant, depth, chosen, warmup, seed) for seed in study.seeds]
            if todo := [run for run in runs if run not in results]:
                seed_runs.update(dict.fromkeys(todo, "seed"))
            else:
                groups[variant, depth, chosen, warmup] = [results[run] for run in runs]
    return Plan({**grid_runs, **seed_runs}, groups, tuning)


def train_study(study, base, worker: Worker) -> Plan:
    """Train every run the study's plan asks for, one after another, or under torchrun with --parallel runs, side by
    side with the other ranks (study/parallel.py); return the plan once nothing is left to train."""
    results: dict[Run, dict | None] = {}
    said = set()

    def say(message: str) -> None:
        if message not in said:
            said.add(message)
            print(message)

    if study.tune_lr:
        unigram, points = unigram_loss(base), {}

        def point(run: Run) -> lr_tuning.Point:  # a finished run's point never changes: read its metrics once
            if run not in points:
                points[run] = tuning_point(run[2], results[run], unigram)
            return points[run]
        plan = lambda: tune_plan(study, results, point, say)  # noqa: E731
    else:
        plan = lambda: grid_plan(study, results)  # noqa: E731

    if worker.world_size > 1 and study.parallel == "runs":
        def pending() -> list[tuple[Run, str]]:
            current = plan()
            # runs other ranks finished since the last look (and, in turn, what their results let train)
            while fresh := {run: s for run in current.pending if (s := finished_run(base, study, *run))}:
                results.update(fresh)
                current = plan()
            return list(current.pending.items())

        def train_one(item: tuple[Run, str]) -> None:
            run, job = item
            results[run] = train_or_reuse(base, study, *run, job)

        # With --tune_lr a finished grid lets new runs train, and rank 0 writes the report: those ranks wait for
        # the others; in a grid study the other ranks are done once nothing is left to take.
        train_in_parallel(pending, lambda item: Path(study.out_dir) / ".claims" / f"{run_name(*item[0])}.lock",
                          lambda item: Path(study.out_dir) / "runs" / run_name(*item[0]), train_one,
                          base.dist_timeout, wait=bool(study.tune_lr) or worker.rank == 0)
        return plan()
    while (current := plan()).pending:
        run, job = next(iter(current.pending.items()))
        results[run] = train_or_reuse(base, study, *run, job)
    return current


def tokenize_once(base, claims: Path) -> None:
    """Under torchrun with --parallel runs: the corpus is tokenized by the first rank of each machine to get here
    (into the machine's token cache), while the others wait, then read its cache."""
    with waiting_claim(claims / f"tokenizing-{socket.gethostname()}.lock", base.dist_timeout,
                       "to tokenize the corpus"):
        tokenizer = load_tokenizer(base.tokenizer_path)
        for split in ("train", "validation"):
            prepare_split(base.data_path, split, tokenizer, base.text_field, num_proc=base.num_proc,
                          streaming=base.streaming)


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
