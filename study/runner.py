"""A study's runs: their names, flags and folders, reuse of the finished ones, the plan of what trains next
(every grid point, or with --tune_lr each lr grid, then the other seeds at the choice), training it one run
after another or side by side under torchrun."""

import functools
import io
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from common.cli import UserError
from common.environment import usable_cores
from data import load_tokenizer, prepare_split
from data.token_stream import ORDER, tokenizer_fingerprint
from study import lr_tuning
from study.claims import batch_order, read_json
from study.parallel import Worker, meet, train_in_parallel
from study.report import read_tuning
from study.variants import PLACEMENT_DEFAULTS
from trainer.args import BOOKKEEPING, RunConfig, parse_args
from trainer.checkpoint import newest_state, step_folders
from trainer.runtime import pick_device
from trainer.train_pretrain import train

REPO = Path(__file__).resolve().parents[1]

# What each run of a study sets for itself (run_args), all of it in the run's name: its variant and
# the fields a variant name sets (the norm type as --norm), its depth, lr, warmup and seed. The other
# flags, the bookkeeping aside, are the study's setting: one per folder (check_setting).
PER_RUN = ("variant", "norm", *PLACEMENT_DEFAULTS, "mix_ln_fraction", "num_hidden_layers",
           "learning_rate", "warmup_steps", "seed")


def run_name(variant: str, depth: int, lr: float, warmup: int, seed: int) -> str:
    return f"{variant}-L{depth}-lr{lr:g}-wu{warmup}-s{seed}"


def run_args(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int,
             job: str = "run") -> RunConfig:
    """One run's flags: the trainer's parse of the study's trainer flags and the run's own (its
    --variant, depth, lr, warmup, seed, folder and wandb names); job is trainer/args.py WANDB_JOBS."""
    name = run_name(variant, depth, lr, warmup, seed)
    out_dir = Path(study.out_dir) / "runs" / name
    # A run with a checkpoint continues; one without starts afresh over whatever a crash before its
    # first checkpoint left in its folder (this study's own, named after the run).
    resume = bool(out_dir.is_dir() and step_folders(out_dir))
    own = ["--variant", variant, "--num_hidden_layers", str(depth), "--learning_rate", str(lr),
           "--warmup_steps", str(warmup), "--seed", str(seed), "--out_dir", str(out_dir),
           "--resume" if resume else "--overwrite", "--wandb_run_name", name, "--wandb_job", job,
           "--wandb_group", base.wandb_group or wandb_group(study.out_dir)]
    if base.min_lr is not None:
        own += ["--min_lr", str(capped_min_lr(base, lr))]
    return parse_args([*study.trainer_flags, *own])


def wandb_group(out_dir) -> str:
    """A study's wandb group: its folder from the repository (docs/results/epochs/L8), else its last
    two names; the last alone (L8, ablation) repeats across studies, and a home path is no one's."""
    path = Path(out_dir).resolve()
    if path.is_relative_to(REPO):
        return path.relative_to(REPO).as_posix()
    return "/".join(path.parts[-2:])


def capped_min_lr(base, lr: float) -> float | None:
    """A run's --min_lr: the study's, at most the run's peak."""
    return None if base.min_lr is None else min(base.min_lr, lr)


def read_summary(path: Path) -> dict:
    """A run's summary.json; a damaged one is a UserError naming it."""
    return read_json(path, advice="delete its run's folder to train the run again")


def check_setting(base, study) -> None:
    """Refuse, in one line, a study whose folder holds runs of another setting, before anything
    trains: every run recorded there is checked, on the flags the study's runs share (not on one its
    record lacks, an older trainer's), and on the hashes of the data and tokenizer. A run killed
    midway has no summary yet: its newest step's training state, which a rerun would continue."""
    folder = Path(study.out_dir)
    summaries = [read_summary(p) for p in sorted(folder.glob("runs/*/summary.json"))]
    midway = [newest_state(run) for run in sorted(folder.glob("runs/*"))
              if not (run / "summary.json").exists()]
    records = summaries + [state for state in midway if state is not None]
    if not records:
        return
    older = any(batch_order(s) != ORDER for s in summaries)
    if older and not study.report_only:  # a report of them alone mixes nothing
        raise UserError(f"{folder} holds runs of an older version, which drew random windows: new runs "
                        "read each window once per epoch and cannot be compared with them; use a new "
                        "--out_dir (--report_only still reports the folder)")
    tokenizer, *splits = token_splits(base)  # as the trainer records them (train_pretrain.load_data)
    data = {"tokenizer": tokenizer_fingerprint(tokenizer)} | {
        s.split: {"num_tokens": s.num_tokens, "sha256": s.sha256} for s in splits}
    same_data = all(record.get("data", data) == data for record in records)
    # the same files under another spelling of their paths
    # (./corpus.jsonl, an absolute path) are the same data
    paths = ("data_path", "tokenizer_path") if same_data else ()
    shared = {k: v for k, v in vars(base).items() if k not in (*BOOKKEEPING, *PER_RUN, *paths)}
    # a report of the folder needs its study's own flags: they say which runs are its
    advice = ("repeat the study's own flags" if study.report_only
              else "use a new --out_dir for a different setting")
    for record in records:
        # the model's width: a summary before the trainer resolved it holds null in its args
        args = record["args"]
        width = record["hidden_size"] if "hidden_size" in record else args.get("hidden_size")
        recorded = args | {"hidden_size": width}
        expected = shared | {"min_lr": capped_min_lr(base, recorded["learning_rate"])}
        if changed := [k for k in expected if k in recorded and recorded[k] != expected[k]]:
            was = " and ".join(f"--{k} {recorded[k]}" for k in changed)
            now = " and ".join(str(expected[k]) for k in changed)
            raise UserError(f"{folder} holds runs trained with {was}, not {now}; {advice}")
    if not same_data:
        raise UserError(f"{folder} holds runs trained on other data or tokenizer than --data_path and "
                        f"--tokenizer_path give now; {advice}")
    if (folder / "tuning.json").is_file():
        check_choices(folder, study, advice)


def check_choices(folder: Path, study, advice: str) -> None:
    """Refuse a command that would choose the lrs of a folder that chose them (its tuning.json) another
    way: it would rewrite the report, and could count a tune seed as fresh. A variant the folder tuned takes
    --tune_lr on the same tune seeds; one whose lr it copied, --lr_from from the same study."""
    if not (study.tune_lr or study.lr_from):
        raise UserError(f"{folder} holds a study that chose its lrs (tuning.json): give its --tune_lr "
                        f"(or --lr_from) again; {advice}")
    for record in read_tuning(folder / "tuning.json"):
        key = record["variant"], record["depth"]
        if record["variant"] not in study.variants or record["depth"] not in study.depths:
            continue
        source = record.get("lr_from")  # the study the folder copied it from
        given = study.lr_from[key]["lr_from"] if study.lr_from else None
        if source and (given is None or Path(source).resolve() != Path(given).resolve()):
            raise UserError(f"{folder} copied {key[0]} L{key[1]}'s lr from {source}: give --lr_from "
                            f"{source} again, or use a new --out_dir")
        if given and not source:
            raise UserError(f"{folder} chose {key[0]} L{key[1]}'s lr by --tune_lr: give its --tune_lr "
                            "again, or use a new --out_dir")
        chose_on = record.get("tune_seeds")
        if study.tune_lr and chose_on is not None and set(chose_on) != set(study.tune_seeds):
            seeds = " ".join(map(str, chose_on))
            raise UserError(f"{folder} chose {key[0]} L{key[1]}'s lr on tune seeds {seeds}, not "
                            f"{' '.join(map(str, study.tune_seeds))}: give --tune_seeds {seeds}, or use "
                            "a new --out_dir")


def finished_run(base, study, *run) -> dict | None:
    """The summary of a run of the study that is finished (trained to --max_steps, or diverged), with out_dir
    where it is now, wherever the study ran from then; None if it is not."""
    out_dir = Path(study.out_dir) / "runs" / run_name(*run)
    if not (out_dir / "summary.json").exists():
        return None
    summary = read_summary(out_dir / "summary.json")
    ranks = int(os.environ.get("WORLD_SIZE", "1"))  # what each run trains on: 1 with --parallel runs
    if summary["world_size"] != ranks:
        raise UserError(f"{out_dir} was trained on {summary['world_size']} data-parallel ranks, this study "
                        f"trains each run on {ranks}: its batches differ; use a new --out_dir, or the same "
                        "--parallel mode and number of ranks")
    # a run stopped on its last step is resumed: its trainer then writes the whole summary
    if summary.get("interrupted") or not (summary["diverged"] or summary["step"] >= base.max_steps):
        return None
    if not (out_dir / "metrics.jsonl").is_file():  # the plateau rule and the figures read it
        raise UserError(f"{out_dir} is finished but its metrics.jsonl is missing; restore it, or delete "
                        "the run's folder to train it again")
    return {**summary, "out_dir": str(out_dir)}


def run_one(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int,
            job: str = "run") -> dict | None:
    """Train one run of the study, or reuse it if finished, and return its summary: None on DDP ranks other
    than 0 (they only get the outcome, not the numbers); StudyInterrupted when a signal stopped it."""
    run = variant, depth, lr, warmup, seed
    if (summary := finished_run(base, study, *run)) is None:
        args = run_args(base, study, *run, job)
        print(f"\n=== {args.wandb_run_name}")
        summary = train(args, resumed_by="the study's command, run again,")
        if summary["diverged"]:  # a finished run ends in the trainer's closing line; a diverged one in this
            print(f"diverged: {summary['divergence']}; the study records it and goes on")
    if summary["interrupted"]:
        raise StudyInterrupted
    return summary if "out_dir" in summary else None


def token_splits(base) -> tuple:
    tokenizer = load_tokenizer(base.tokenizer_path)
    return tokenizer, *(prepare_split(base.data_path, split, tokenizer, base.text_field,
                                      num_proc=base.num_proc, streaming=base.streaming)
                        for split in ("train", "validation"))


def tuning_point(lr: float, run: dict) -> lr_tuning.Point:
    """A finished run as a grid point: its final validation loss, usable unless it diverged or plateaued (the
    trainer's verdict, trainer/evaluation.py)."""
    finite = not run["diverged"] and run["val_loss"] is not None and math.isfinite(run["val_loss"])
    return lr_tuning.Point(lr, run["val_loss"] if finite else None, finite and not run["plateaued"])


class StudyInterrupted(Exception):
    """A run stopped on a signal; the same command continues the study where it stopped."""


Run = tuple[str, int, float, int, int]  # (variant, depth, lr, warmup, seed)


@dataclass
class Plan:
    """Where a study stands: the runs that can train now, in order, each with its job (trainer/args.py
    WANDB_JOBS); the groups of finished runs the report compares; with --tune_lr every (variant, depth)'s
    choice so far."""
    pending: dict[Run, str]
    groups: dict[tuple, list[dict]]
    tuning: list[dict] | None = None


def grid_plan(study, results: dict[Run, dict | None]) -> Plan:
    """Every variant at every depth, lr, warmup and seed. A None result is a run this DDP rank took part
    in."""
    runs = [(variant, depth, lr, warmup, seed) for depth in study.depths for lr in study.learning_rates
            for warmup in study.warmup_steps for variant in study.variants for seed in study.seeds]
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        if results.get(run) is not None:
            groups.setdefault(run[:4], []).append(results[run])
    return Plan({run: "run" for run in runs if run not in results}, groups)


def grid_choice(study, variant: str, depth: int, results: dict[Run, dict], point, say) -> tuple[list, dict]:
    """A (variant, depth)'s lr grid with every tune seed: the grid runs still missing, or once none is, the
    tuning record of its choice by the mean over the tune seeds (lr_tuning.grid_point), the grid grown past a
    winning edge, or both ways when no lr trains. point(run) is a finished run as a grid point (one seed);
    say(message) tells a decision once."""
    warmup, tune_seeds = study.warmup_steps[0], study.tune_seeds
    lrs = sorted(study.tune_lr_for.get(variant, study.tune_lr))
    extensions = 0
    while True:
        grid = [(variant, depth, lr, warmup, seed) for lr in lrs for seed in tune_seeds]
        missing = [run for run in grid if run not in results]
        if missing:
            break
        seed_points = [[point((variant, depth, lr, warmup, seed)) for seed in tune_seeds] for lr in lrs]
        points = [lr_tuning.grid_point(lr, p) for lr, p in zip(lrs, seed_points, strict=True)]
        chosen = lr_tuning.choose_lr(points)
        new = lr_tuning.edge_extension(lrs, chosen)
        if new and extensions == lr_tuning.MAX_EXTENSIONS and chosen is not None:
            say(f"{variant} L{depth}: the best lr, {chosen:g}, is still at the grid's edge after "
                f"{lr_tuning.MAX_EXTENSIONS} extensions; kept, but a better one may lie outside")
        if not new or extensions == lr_tuning.MAX_EXTENSIONS:
            break
        extensions += 1
        why = (f"the best lr, {chosen:g}, is at the edge of the grid" if chosen is not None
               else "no lr of the grid trained on every tune seed without diverging or plateauing")
        say(f"{variant} L{depth}: {why}; adding {' and '.join(f'{lr:g}' for lr in new)} (extension "
            f"{extensions} of {lr_tuning.MAX_EXTENSIONS})")
        lrs = sorted([*lrs, *new])
    if missing:
        return missing, {}
    if chosen is None:
        say(f"{variant} L{depth}: no lr of {', '.join(f'{lr:g}' for lr in lrs)} trained without diverging or "
            "plateauing on every tune seed; its other seeds are not trained")
    return [], {"variant": variant, "depth": depth, "learning_rates": lrs, "tune_seeds": tune_seeds,
                "seed_losses": [[p.val_loss for p in ps] for ps in seed_points],
                "val_losses": [p.val_loss for p in points], "usable": [p.usable for p in points],
                "chosen_lr": chosen, "at_edge": chosen is not None and bool(new),
                "usable_range": lr_tuning.usable_range(points)}


def tune_plan(study, results: dict[Run, dict], point, say) -> Plan:
    """--tune_lr: each (variant, depth)'s grid_choice, then every seed of --seeds (and the tune seeds) at the
    chosen lr only; with --lr_from, --seeds at the lr another study chose. Grid runs go out before other
    seeds, so no rank idles while a grid still has runs to train."""
    grid_runs, seed_runs, groups, tuning = {}, {}, {}, []
    for depth in study.depths:
        for variant in study.variants:
            if record := study.lr_from.get((variant, depth)):
                seeds = study.seeds
            else:
                missing, record = grid_choice(study, variant, depth, results, point, say)
                grid_runs.update(dict.fromkeys(missing, "grid"))
                seeds = list(dict.fromkeys([*study.tune_seeds, *study.seeds]))
            if not record:
                continue
            tuning.append(record)
            if record["chosen_lr"] is None:
                continue
            runs = [(variant, depth, record["chosen_lr"], study.warmup_steps[0], seed) for seed in seeds]
            seed_runs.update({run: "seed" for run in runs if run not in results})
            if all(run in results for run in runs):
                groups[runs[0][:4]] = [results[run] for run in runs]
    return Plan({**grid_runs, **seed_runs}, groups, tuning)


def depths_held(study) -> set[int]:
    """The depths of the runs in the study's folder (finished or stopped)."""
    summaries = Path(study.out_dir).glob("runs/*/summary.json")
    return {read_summary(p)["args"]["num_hidden_layers"] for p in summaries}


def train_study(study, base, worker: Worker) -> Plan:
    """Train every run the study's plan asks for, one after another, or under torchrun with --parallel runs,
    side by side with the other ranks (study/parallel.py); return the plan once nothing is left to train."""
    results: dict[Run, dict | None] = {}
    say = functools.cache(print)  # a decision is told once, however often the plan is made again

    def train_one(item: tuple[Run, str]) -> None:
        run, job = item
        results[run] = run_one(base, study, *run, job)

    if study.tune_lr or study.lr_from:
        point = lambda run: tuning_point(run[2], results[run])  # noqa: E731
        plan = lambda: tune_plan(study, results, point, say)  # noqa: E731
    else:
        plan = lambda: grid_plan(study, results)  # noqa: E731

    def finished_so_far() -> Plan:
        current = plan()
        # runs finished earlier or by other ranks (and, in turn, what their results let train)
        while True:
            found = {run: finished_run(base, study, *run) for run in current.pending}
            fresh = {run: summary for run, summary in found.items() if summary}
            if not fresh:
                return current
            results.update(fresh)
            current = plan()

    if study.report_only:
        current = finished_so_far()
        missing = f"--report_only: {len(current.pending)} runs the study asks for are not trained"
        # the folder's runs all at other depths: its --depths (or --num_hidden_layers) left out;
        # other variants or seeds may be another command's, in a folder they share
        held = depths_held(study)
        if held and not held & set(study.depths):
            missing += (f"; the runs in {study.out_dir} have {' or '.join(map(str, sorted(held)))} "
                        "layers: give the study's own --depths")
        print(missing)
        return current
    if worker.world_size > 1 and study.parallel == "runs":
        # every rank's plan holds every rank's finished runs, read from their summaries
        train_in_parallel(lambda: list(finished_so_far().pending.items()), train_one, worker,
                          base.dist_timeout)
        return plan()
    while (current := plan()).pending:
        train_one(next(iter(current.pending.items())))
    return current


def own_share(worker: Worker, base) -> None:
    """Under torchrun with --parallel runs: each run this rank trains is a single-process run on its own GPU
    or its share of the cores."""
    if pick_device(base.device).type == "cuda":
        if worker.local_world_size > torch.cuda.device_count():
            raise UserError(f"{worker.local_world_size} ranks on this node but {torch.cuda.device_count()} "
                            "GPUs: start torchrun with --nproc_per_node at most the number of GPUs")
        torch.cuda.set_device(worker.local_rank)  # what --device cuda means; runs record the flag as given
    else:
        torch.set_num_threads(max(1, usable_cores() // worker.local_world_size))
    # torchrun's variables hidden: else the trainer would join the ranks' runs into one DDP job
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
    sys.stdout = RankLines(worker.rank, sys.stdout)
    sys.stderr = RankLines(worker.rank, sys.stderr)


class RankLines(io.TextIOBase):
    """A rank's output, as whole lines with the rank in front, each in one write: the ranks share a terminal
    or a log, where a line written in pieces runs into another rank's. A progress bar redraws its line with
    '\\r'; only its last state is written, when the bar ends its line."""

    def __init__(self, rank: int, stream):
        self.prefix = f"[rank {rank}] "
        self.stream = stream
        self.line = ""

    @property
    def encoding(self) -> str:  # tqdm draws its bar in Unicode when the stream's encoding allows it
        return self.stream.encoding

    def write(self, text: str) -> int:
        *lines, self.line = (self.line + text).split("\n")
        for line in lines:
            self.stream.write(self.prefix + line.rpartition("\r")[2] + "\n")
            self.stream.flush()
        self.line = self.line.rpartition("\r")[2]
        return len(text)


def tokenize_once(base, worker: Worker) -> None:
    """Under torchrun with --parallel runs: each machine's local rank 0 tokenizes the corpus into its token
    cache while the other ranks wait (at most --dist_timeout minutes); then the others read the cache."""
    if worker.local_rank == 0:
        token_splits(base)
    meet(worker, base.dist_timeout)
    if worker.local_rank != 0:
        token_splits(base)
