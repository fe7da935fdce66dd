"""Normalization ablation: one training job for several variants, depths and seeds, then figures and a table.

    python scripts/run_ablation.py --out_dir out/ablation --seeds 0 1 2 --max_steps 300
    python scripts/run_ablation.py --variants pre-rmsnorm post-rmsnorm deepnorm-rmsnorm --depths 8 16 32
    python scripts/run_ablation.py --learning_rates 1e-3 3e-3 1e-2 --warmup_steps 0 50   # stability grid
    python scripts/run_ablation.py --tune_lr 2e-3 4e-3 8e-3 1.6e-2 --seeds 0 1 2 3 4 --out_dir out/fair
    python scripts/run_ablation.py --lr_from out/fair --max_steps 1600 --seeds 2 3 4 --out_dir out/fair-1600
    torchrun --nproc_per_node 2 scripts/run_ablation.py --tune_lr 2e-3 4e-3 8e-3 --seeds 0 1 2 3 4

Every run is trainer.train_pretrain.train, its flags the trainer's parse of the study's with the run's
--variant, depth, lr, warmup and seed added; any trainer flag passes through. A variant is
<placement>-<norm> (pre-rmsnorm, pre+qk_head-rmsnorm; study/variants.py) or a name of model/names.py. A
finished run is reused, so an interrupted study, run again, picks up where it stopped; its report adds to an
earlier command's there. A study folder holds one setting: other shared flags or data are refused.

--tune_lr compares every variant at its own best peak lr: the tune seeds (the first two of --seeds) train at
each grid point; the lowest mean final validation loss of an lr at which no tune seed diverged or plateaued
wins (the grid grows past a winning edge, both ways when nothing trains); then the other seeds, fresh ones,
train at that lr, and the report gives each variant's difference against --baseline on them, with its 98% CI
and p (study/claims.py, docs/results/README.md). Under torchrun the ranks train whole runs side by side
(--parallel runs) or each run in turn across all ranks (--parallel data); rank 0 writes the report.
--lr_from trains each variant at the lr another such study chose (its tuning.json), e.g. a longer rung at the
lrs a shorter one chose: every seed not among that study's tune seeds is fresh.
"""

import os
import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, count, positive_float, positive_int, run_cli, user_path
from model.model_minimind import with_implied
from model.names import norm_variant
from study.parallel import Worker
from study.report import read_tuning, report
from study.runner import StudyInterrupted, check_setting, own_share, tokenize_once, train_study
from study.variants import PLACEMENT_DEFAULTS, VARIANTS, variant_fields, variant_problem
from trainer import args as trainer_args
from trainer.checkpoint import step_folders

# Flags each run gets from the study, so passing them as trainer flags would be ignored or contradictory.
SET_PER_RUN = ("--seed", "--resume", "--overwrite", "--variant", "--mix_ln_fraction",
               *(f"--{name}" for name in ("norm", "norm_type", *PLACEMENT_DEFAULTS)))


def variant_grid(text: str) -> tuple[str, list[float]]:
    """'post-rmsnorm=5e-4,1e-3' -> ('post-rmsnorm', [0.0005, 0.001])."""
    variant, _, lrs = text.partition("=")
    return variant, [positive_float(lr) for lr in lrs.split(",")]


def parse_args(argv=None) -> tuple[Namespace, Namespace]:
    p = ArgumentParser(description=__doc__, epilog="Other flags are the trainer's (train_pretrain.py).")
    p.add_argument("--variants", nargs="+", help="variant names, or 'all': each placement, each norm type",
                   default=["pre-rmsnorm", "pre-layernorm", "post-rmsnorm", "post-layernorm"])
    p.add_argument("--seeds", nargs="+", type=count, default=[0], help="a run per variant and seed")
    p.add_argument("--depths", nargs="+", type=positive_int, help="numbers of blocks, a run each (default: "
                   "the trainer's --num_hidden_layers)")
    p.add_argument("--learning_rates", nargs="+", type=positive_float, help="stability grid: peak lrs")
    p.add_argument("--warmup_steps", nargs="+", type=count, help="stability grid: warmup lengths")
    p.add_argument("--tune_lr", nargs="+", type=positive_float, metavar="LR", help="fair study: the lr grid "
                   "every variant starts from (see above)")
    p.add_argument("--tune_seeds", nargs="+", type=count, help="with --tune_lr: the seeds that train "
                   "every grid point; their mean chooses the lr (default: the first two of --seeds)")
    p.add_argument("--tune_lr_for", nargs="+", default=[], type=variant_grid, metavar="VARIANT=LR,LR,...",
                   help="with --tune_lr: a variant's own starting grid, e.g. post-rmsnorm=5e-4,1e-3,2e-3")
    p.add_argument("--lr_from", type=user_path, metavar="STUDY", help="instead of --tune_lr: each variant's "
                   "lr is the one STUDY/tuning.json records (see above)")
    p.add_argument("--report_only", action="store_true", help="report the finished runs, train nothing")
    p.add_argument("--baseline", help="with --tune_lr: the variant each is compared with, one of --variants "
                   "or trained in --out_dir by an earlier command (default: pre-rmsnorm)")
    p.add_argument("--out_dir", default="out/ablation", type=user_path,
                   help="study folder: runs/, figures, results.md")
    p.add_argument("--parallel", choices=("runs", "data"), default="runs", help="under torchrun: each rank "
                   "trains whole runs side by side (runs), or every run in turn across all ranks (data)")
    own, rest = p.parse_known_args(argv)
    given = [flag for flag in SET_PER_RUN if flag in {a.split("=")[0] for a in rest}]
    if "--resume" in given:
        raise UserError("--resume: run the study's command again, as it was; it reuses the finished runs "
                        "and continues a stopped one")
    if "--overwrite" in given:
        raise UserError("--overwrite: a study never overwrites its runs; give it a new --out_dir")
    if given:
        raise UserError(f"{', '.join(given)}: set per run by the study; use --seeds and --variants")
    # a trainer's run folder: the study's report and figures would land among its files
    if step_folders(own.out_dir) or (Path(own.out_dir) / "summary.json").is_file():
        raise UserError(f"--out_dir {own.out_dir} is a training run's folder; give the study one of its own")
    if (Path(own.out_dir) / "results.md").is_file() and not (Path(own.out_dir) / "results.json").is_file():
        raise UserError(f"{own.out_dir}/results.md is not a study's report; move it or use another --out_dir")
    if own.report_only and not (Path(own.out_dir) / "runs").is_dir():
        raise UserError(f"--report_only: {own.out_dir} holds no runs; is it the study's --out_dir?")
    variants = [v for v in VARIANTS if not variant_problem(v)] if own.variants == ["all"] else own.variants
    for v in variants:
        try:
            fields = variant_fields(v)
        except ValueError as err:
            raise UserError(f"--variants: {err}") from None
        if problem := variant_problem(v):
            raise UserError(f"variant {v!r} makes no model ({problem})")
        # one model, one name: two spellings of it would train it twice, under two folders
        if (spelled := norm_variant(with_implied(fields))) != v:
            raise UserError(f"variant {v!r} is the model its runs record as {spelled!r}: use that name")
    own.tune_lr_for = dict(own.tune_lr_for)
    if own.tune_lr is None and (own.tune_lr_for or own.tune_seeds):
        raise UserError("--tune_lr_for and --tune_seeds go with --tune_lr")
    chooser = "--tune_lr" if own.tune_lr else "--lr_from" if own.lr_from else None
    if chooser and (own.learning_rates or len(own.warmup_steps or [0]) > 1):
        raise UserError(f"{chooser} picks each variant's lr itself: drop --learning_rates, and give one "
                        "--warmup_steps")
    # one lr is no choice, and it is both edges of its grid: which way would the grid grow?
    grids = {"--tune_lr": own.tune_lr} if own.tune_lr else {}
    grids |= {f"--tune_lr_for {variant}": lrs for variant, lrs in own.tune_lr_for.items()}
    if thin := [flag for flag, lrs in grids.items() if len(set(lrs)) < 2]:
        raise UserError(f"{thin[0]}: give two or more lrs to choose among (one lr: --learning_rates)")
    if bad := [v for v in own.tune_lr_for if v not in variants]:
        raise UserError(f"--tune_lr_for {' '.join(bad)}: not one of --variants")
    if own.tune_lr and int(os.environ.get("WORLD_SIZE", "1")) > 1 and own.parallel == "data":
        raise UserError("--tune_lr trains its grid's runs side by side: use --parallel runs")
    own.trainer_flags = rest  # each run adds its own (study/runner.py run_args)
    base = trainer_args.parse_args(rest)
    side_by_side = int(os.environ.get("WORLD_SIZE", "1")) > 1 and own.parallel == "runs"
    if side_by_side and ":" in base.device:  # the trainer would put every rank on that one GPU
        raise UserError(f"--parallel runs trains each rank on its own GPU: give --device cuda, "
                        f"not {base.device}")
    own.lr_from = lr_records(own.lr_from, variants, own.depths or [base.num_hidden_layers], own.tune_lr)
    # each value once: a repeated seed or variant is the same run, which would weigh twice in every mean
    own.variants, own.seeds = list(dict.fromkeys(variants)), list(dict.fromkeys(own.seeds))
    own.tune_seeds = list(dict.fromkeys(own.tune_seeds or own.seeds[:2]))
    own.tune_lr = sorted(set(own.tune_lr)) if own.tune_lr else None
    own.depths = list(dict.fromkeys(own.depths or [base.num_hidden_layers]))
    own.learning_rates = list(dict.fromkeys(own.learning_rates or [base.learning_rate]))
    own.warmup_steps = list(dict.fromkeys(own.warmup_steps or [base.warmup_steps]))
    # given, it must be trained here, by this command or an earlier one at each depth;
    # the default is simply absent from a study without it
    if own.baseline is not None and own.baseline not in own.variants:
        runs = Path(own.out_dir) / "runs"
        trained = [any(runs.glob(f"{own.baseline}-L{depth}-*/summary.json")) for depth in own.depths]
        if not all(trained):
            raise UserError(f"--baseline {own.baseline}: not one of --variants, and {own.out_dir} holds "
                            "no run of it to compare with")
    own.baseline = own.baseline or "pre-rmsnorm"
    # e.g. --max_steps 20 on CPU, whose default warmup is 100 steps: the trainer only warns,
    # but a tuning grid would choose among lrs its runs never reach, and grow on them
    if own.tune_lr and own.warmup_steps[0] > base.max_steps:
        raise UserError(f"--tune_lr: --warmup_steps {own.warmup_steps[0]} is longer than each run "
                        f"(--max_steps {base.max_steps}), so no run would reach its lr; set "
                        "--warmup_steps at most --max_steps")
    return own, base


def lr_records(study: str | None, variants: list[str], depths: list[int], tune_lr) -> dict:
    """(variant, depth) -> the tuning.json record of the study that chose its lr, marked with the study."""
    if study is None:
        return {}
    if tune_lr:
        raise UserError("--lr_from takes the lrs another study chose: drop --tune_lr")
    given = Path(study)
    path = given if given.is_file() else given / "tuning.json"  # the study folder, or its tuning.json
    if not path.is_file():
        raise UserError(f"--lr_from {study}: no tuning.json (run_ablation.py --tune_lr writes it)")
    records = read_tuning(path)
    study = path.parent
    chosen = {(t["variant"], t["depth"]): {**t, "lr_from": str(study)} for t in records if t["chosen_lr"]}
    if missing := [f"{v} L{d}" for v in variants for d in depths if (v, d) not in chosen]:
        raise UserError(f"--lr_from {study} chose no lr for {', '.join(missing)}")
    return chosen


def main(argv: list[str] | None = None) -> None:
    study, base = parse_args(argv)
    worker = Worker.from_environment()
    runs_side_by_side = worker.world_size > 1 and study.parallel == "runs"
    if runs_side_by_side:  # each run the ranks train is a single-process one
        own_share(worker, base)
        tokenize_once(base, worker)
    check_setting(base, study)
    try:
        plan = train_study(study, base, worker)
    except StudyInterrupted:
        print("study interrupted; run the same command again to continue where it stopped")
        return
    if runs_side_by_side and worker.rank != 0:
        return  # rank 0 writes the report, once every rank's runs are finished
    if plan.groups or plan.tuning:
        report(study, plan.groups, plan.tuning)


if __name__ == "__main__":
    run_cli(main)
