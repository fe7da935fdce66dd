"""A study's runs: their names, flags and folders, reuse of the finished ones, the plan of what trains next (every
grid point, or with --tune_lr each lr grid, then the other seeds at the choice), training it one run after another
or side by side under torchrun, and the plateau rule the lr choice and the report both apply."""

import functools
import json
import math
import os
import socket
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from common.cli import UserError
from data import load_tokenizer, prepare_split
from study import lr_tuning
from study.parallel import Worker, train_in_parallel, waiting_claim
from study.variants import VARIANTS
from trainer import evaluation
from trainer.args import flags_with, validate
from trainer.run_dir import find_checkpoints, recorded_value
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

PLATEAU_MARGIN = evaluation.PLATEAU_MARGIN


def run_name(variant: str, depth: int, lr: float, warmup: int, seed: int) -> str:
    return f"{variant}-L{depth}-lr{lr:g}-wu{warmup}-s{seed}"


# Flags that do not change what a run computes, so a finished run made with other values is still valid.
BOOKKEEPING = set(flags_with("bookkeeping"))


def run_args(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int, job: str = "run"):
    """The trainer flags of one run of the study; job is what the run is to it (trainer/args.py WANDB_JOBS)."""
    name = run_name(variant, depth, lr, warmup, seed)
    out_dir = Path(study.out_dir) / "runs" / name
    # A run with a checkpoint continues; one without starts afresh over whatever a crash before its first
    # checkpoint left in its folder (this study's own, named after the run).
    resume = bool(find_checkpoints(out_dir))
    return Namespace(**{**vars(base), **VARIANTS[variant], "num_hidden_layers": depth, "seed": seed,
                        "learning_rate": lr, "warmup_steps": warmup, "min_lr": None if base.min_lr is None else min(base.min_lr, lr),
                        "out_dir": str(out_dir), "resume": resume, "overwrite": not resume,
                        "wandb_group": base.wandb_group or Path(study.out_dir).name, "wandb_run_name": name,
                        "wandb_job": job})


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


def run_one(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int,
            job: str = "run") -> dict | None:
    """Train one run of the study, or reuse it if finished, and return its summary: None on DDP ranks other than 0
    (they only get the outcome, not the numbers); StudyInterrupted when a signal stopped it."""
    run = variant, depth, lr, warmup, seed
    if (summary := finished_run(base, study, *run)) is None:
        args = run_args(base, study, *run, job)
        print(f"\n=== {args.wandb_run_name}")
        summary = train(validate(args))
        if summary["diverged"]:  # a finished run ends in the trainer's own closing line; a diverged one in this
            print(f"diverged: {summary['divergence']}; the study records it and goes on")
    if summary["interrupted"]:
        raise StudyInterrupted
    return summary if "out_dir" in summary else None


def token_splits(base) -> tuple:
    tokenizer = load_tokenizer(base.tokenizer_path)
    return tokenizer, *(prepare_split(base.data_path, split, tokenizer, base.text_field, num_proc=base.num_proc,
                                      streaming=base.streaming) for split in ("train", "validation"))


def unigram_loss(base) -> float:
    """The validation loss of the best context-free model on the study's data (trainer/evaluation.py)."""
    tokenizer, train_split, val_split = token_splits(base)
    return evaluation.unigram_loss(train_split.tokens, val_split.tokens, len(tokenizer))


def plateaued(run: dict, metrics: list[dict], unigram: float) -> bool:
    """Whether a run trained without diverging but learned nothing (trainer/evaluation.py's rule); the trainer
    records it in the summary, and this computes it for a summary that does not."""
    if run["diverged"] or run["val_loss"] is None:
        return False
    if "plateaued" in run:
        return run["plateaued"]
    return evaluation.plateaued([r["loss"] for r in metrics if r["split"] == "val"], unigram)


def tuning_point(lr: float, run: dict, unigram: float) -> lr_tuning.Point:
    """A finished run as a grid point: its final validation loss, usable unless it diverged or plateaued."""
    finite = not run["diverged"] and run["val_loss"] is not None and math.isfinite(run["val_loss"])
    usable = finite and not plateaued(run, read_metrics(Path(run["out_dir"]) / "metrics.jsonl"), unigram)
    return lr_tuning.Point(lr, run["val_loss"] if finite else None, usable)


class StudyInterrupted(Exception):
    """A run stopped on a signal; the same command continues the study where it stopped."""


Run = tuple[str, int, float, int, int]  # (variant, depth, lr, warmup, seed)


@dataclass
class Plan:
    """Where a study stands: the runs that can train now, in order, each with its job (trainer/args.py WANDB_JOBS);
    the groups of finished runs the report compares; with --tune_lr every (variant, depth)'s choice so far."""
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
    """--tune_lr: per (variant, depth), its lr grid with every tune seed; once all its grid runs are finished, the
    choice by the mean over the tune seeds (lr_tuning.grid_point), the grid grown past a winning edge, or both ways
    when no lr trains; then every seed of --seeds at the chosen lr only. Grid runs go out before other seeds, so no
    rank idles while a grid still has runs to train. point(run) is a finished run as a grid point (one seed);
    say(message) tells a decision once."""
    warmup, tune_seeds = study.warmup_steps[0], study.tune_seeds
    grid_runs, seed_runs, groups, tuning = {}, {}, {}, []
    for depth in study.depths:
        for variant in study.variants:
            lrs = sorted(study.tune_lr_for.get(variant, study.tune_lr))
            extensions = 0
            while not (missing := [(variant, depth, lr, warmup, seed) for lr in lrs for seed in tune_seeds
                                   if (variant, depth, lr, warmup, seed) not in results]):
                seed_points = [[point((variant, depth, lr, warmup, seed)) for seed in tune_seeds] for lr in lrs]
                points = [lr_tuning.grid_point(lr, p) for lr, p in zip(lrs, seed_points, strict=True)]
                chosen = lr_tuning.choose_lr(points)
                new = lr_tuning.edge_extension(lrs, chosen)
                if new and extensions == lr_tuning.MAX_EXTENSIONS and chosen is not None:
                    say(f"{variant} L{depth}: the best lr, {chosen:g}, is still at the edge of the grid after "
                        f"{lr_tuning.MAX_EXTENSIONS} extensions; it is kept, but a better one may lie outside")
                if not new or extensions == lr_tuning.MAX_EXTENSIONS:
                    break
                extensions += 1
                why = (f"the best lr, {chosen:g}, is at the edge of the grid" if chosen is not None
                       else "no lr of the grid trained on every tune seed without diverging or plateauing")
                say(f"{variant} L{depth}: {why}; adding {' and '.join(f'{lr:g}' for lr in new)} (extension "
                    f"{extensions} of {lr_tuning.MAX_EXTENSIONS})")
                lrs = sorted([*lrs, *new])
            if missing:
                grid_runs.update(dict.fromkeys(missing, "grid"))
                continue
            tuning.append({"variant": variant, "depth": depth, "learning_rates": lrs, "tune_seeds": tune_seeds,
                           "seed_losses": [[p.val_loss for p in ps] for ps in seed_points],
                           "val_losses": [p.val_loss for p in points], "usable": [p.usable for p in points],
                           "chosen_lr": chosen, "at_edge": chosen is not None and bool(new),
                           "usable_range": lr_tuning.usable_range(points)})
            if chosen is None:
                say(f"{variant} L{depth}: no lr of {', '.join(f'{lr:g}' for lr in lrs)} trained without "
                    "diverging or plateauing on every tune seed; its other seeds are not trained")
                continue
            runs = [(variant, depth, chosen, warmup, seed) for seed in dict.fromkeys([*tune_seeds, *study.seeds])]
            seed_runs.update({run: "seed" for run in runs if run not in results})
            if all(run in results for run in runs):
                groups[variant, depth, chosen, warmup] = [results[run] for run in runs]
    return Plan({**grid_runs, **seed_runs}, groups, tuning)


def train_study(study, base, worker: Worker) -> Plan:
    """Train every run the study's plan asks for, one after another, or under torchrun with --parallel runs, side by
    side with the other ranks (study/parallel.py); return the plan once nothing is left to train."""
    results: dict[Run, dict | None] = {}
    say = functools.cache(print)  # a decision is told once, however often the plan is made again

    def train_one(item: tuple[Run, str]) -> None:
        run, job = item
        results[run] = run_one(base, study, *run, job)

    if study.tune_lr:
        unigram = unigram_loss(base)
        # a finished run's point never changes: its metrics are read once
        point = functools.cache(lambda run: tuning_point(run[2], results[run], unigram))
        plan = lambda: tune_plan(study, results, point, say)  # noqa: E731
    else:
        plan = lambda: grid_plan(study, results)  # noqa: E731

    def finished_so_far() -> Plan:
        current = plan()
        # runs finished earlier or by other ranks (and, in turn, what their results let train)
        while fresh := {run: s for run in current.pending if (s := finished_run(base, study, *run))}:
            results.update(fresh)
            current = plan()
        return current

    if study.report_only:
        current = finished_so_far()
        print(f"--report_only: {len(current.pending)} runs the study asks for are not trained")
        return current
    if worker.world_size > 1 and study.parallel == "runs":
        # With --tune_lr a finished grid lets new runs train, and rank 0 writes the report: those ranks wait for
        # the others; in a grid study the other ranks are done once nothing is left to take.
        train_in_parallel(lambda: list(finished_so_far().pending.items()),
                          lambda item: Path(study.out_dir) / ".claims" / f"{run_name(*item[0])}.lock",
                          lambda item: Path(study.out_dir) / "runs" / run_name(*item[0]), train_one,
                          base.dist_timeout, wait=bool(study.tune_lr) or worker.rank == 0)
        return plan()
    while (current := plan()).pending:
        train_one(next(iter(current.pending.items())))
    return current


def tokenize_once(base, claims: Path) -> None:
    """Under torchrun with --parallel runs: the first rank of each machine to get here tokenizes the corpus into the
    machine's token cache while the others wait for it."""
    with waiting_claim(claims / f"tokenizing-{socket.gethostname()}.lock", base.dist_timeout,
                       "to tokenize the corpus"):
        token_splits(base)
