"""Normalization ablation: the same training job for several norm variants and seeds, then plots and a table.

    python scripts/run_ablation.py --out_dir out/ablation --seeds 0 1 2 --max_steps 300
    python scripts/run_ablation.py --variants all --seeds 0
    python scripts/run_ablation.py --learning_rates 1e-3 3e-3 1e-2 --warmup_steps 0 50   # stability grid

Every run goes through trainer.train_pretrain.train (the same code as `python trainer/train_pretrain.py`),
with identical data, seed list and step budget; any trainer flag passes through. A variant is
<position>-<norm>, e.g. pre-rmsnorm, post-layernorm, pre-dyt. Finished runs are reused when the study is
re-run with the same out_dir, so an interrupted study picks up where it stopped.
"""

import copy
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from model import NORM_POSITIONS, NORM_TYPES
from trainer.args import build_parser, validate
from trainer.checkpoint import find_checkpoints
from trainer.cli import ArgumentParser, UserError, run_cli
from trainer.plots import plot_grid, plot_layer_profiles, plot_loss_curves
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

DEFAULT_VARIANTS = ["pre-rmsnorm", "pre-layernorm", "post-rmsnorm", "post-layernorm"]
ALL_VARIANTS = [f"{pos}-{norm}" for pos in NORM_POSITIONS for norm in sorted(NORM_TYPES)]


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__,
                       epilog="All other flags are trainer flags (see python trainer/train_pretrain.py --help).")
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS,
                   help=f"<position>-<norm> names, or 'all' for every one of: {' '.join(ALL_VARIANTS)}")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="each variant runs once per seed")
    p.add_argument("--learning_rates", nargs="+", type=float, default=None,
                   help="stability grid: peak learning rates (default: the trainer's --learning_rate)")
    p.add_argument("--warmup_steps", nargs="+", type=int, default=None,
                   help="stability grid: warmup lengths (default: the trainer's --warmup_steps)")
    p.add_argument("--out_dir", default="out/ablation", help="study folder: runs/, plots, results.md")
    own, rest = p.parse_known_args(argv)
    variants = ALL_VARIANTS if own.variants == ["all"] else own.variants
    for v in variants:
        if v not in ALL_VARIANTS:
            raise UserError(f"unknown variant {v!r}; choose from {', '.join(ALL_VARIANTS)} or 'all'")
    trainer_args = build_parser().parse_args(rest)
    if {"--seed", "--norm", "--norm_position", "--resume", "--overwrite"} & {a.split("=")[0] for a in rest}:
        raise UserError("--seed, --norm, --norm_position, --resume and --overwrite are set per run by the study; "
                        "use --seeds and --variants (finished runs are reused automatically)")
    own.variants = variants
    own.learning_rates = own.learning_rates or [trainer_args.learning_rate]
    own.warmup_steps = own.warmup_steps or [trainer_args.warmup_steps]
    if any(lr <= 0 for lr in own.learning_rates) or any(w < 0 for w in own.warmup_steps):
        raise UserError("--learning_rates must be > 0 and --warmup_steps >= 0")
    return own, trainer_args


def run_name(variant: str, lr: float, warmup: int, seed: int) -> str:
    return f"{variant}-lr{lr:g}-wu{warmup}-s{seed}"


# Flags that do not change what a run computes, so a finished run made with other values is still valid.
BOOKKEEPING = {"out_dir", "resume", "overwrite", "keep_checkpoints", "use_wandb", "wandb_project", "wandb_run_name",
               "wandb_group", "num_proc"}


def run_one(base, study, variant: str, lr: float, warmup: int, seed: int) -> dict:
    """Train one configuration (or reuse its finished result) and return its summary."""
    out_dir = Path(study.out_dir) / "runs" / run_name(variant, lr, warmup, seed)
    position, norm = variant.split("-", 1)
    args = copy.copy(base)
    args.norm, args.norm_position, args.seed = norm, position, seed
    args.learning_rate, args.warmup_steps = lr, warmup
    args.min_lr = min(base.min_lr, lr)
    # A run with a checkpoint continues; one without starts afresh over whatever a crash before its first
    # checkpoint left in its folder (this study's own, named after the run).
    args.out_dir, args.resume = str(out_dir), bool(find_checkpoints(out_dir))
    args.overwrite = not args.resume
    args.wandb_group = base.wandb_group or Path(study.out_dir).name
    args.wandb_run_name = run_name(variant, lr, warmup, seed)
    done = out_dir / "summary.json"
    if done.exists():
        summary = json.loads(done.read_text())
        changed = sorted(k for k, v in vars(args).items()
                         if k not in BOOKKEEPING and summary.get("args", {}).get(k) != v)
        if changed:
            raise UserError(f"{out_dir} was trained with other values of --{', --'.join(changed)}; "
                            "use a new --out_dir for a different study")
        if summary["diverged"] or summary["step"] >= base.max_steps:
            return summary
    print(f"\n=== {args.wandb_run_name}")
    return train(validate(args))


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def results_table(groups: dict[tuple, list[dict]], grid: bool) -> str:
    head = ["variant", *(["lr", "warmup"] if grid else []), "val loss", "val bpb", "tokens/s", "s/step",
            "norm params", "diverged"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (variant, lr, warmup), runs in groups.items():
        ok = [r for r in runs if not r["diverged"] and r["val_loss"] is not None]
        diverged = sum(r["diverged"] for r in runs)
        row = [variant, *([f"{lr:g}", str(warmup)] if grid else []),
               mean_std([r["val_loss"] for r in ok]), mean_std([r["val_bpb"] for r in ok]),
               f"{statistics.mean(r['tokens_per_s'] for r in ok):.0f}" if ok else "—",
               f"{statistics.mean(r['s_per_step'] for r in ok):.3f}" if ok else "—",
               f"{runs[0]['norm_params']:,}", f"{diverged}/{len(runs)}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def report(study, groups: dict[tuple, list[dict]]) -> None:
    out = Path(study.out_dir)
    grid = len(study.learning_rates) > 1 or len(study.warmup_steps) > 1
    metrics = {key: [read_metrics(Path(r["out_dir"]) / "metrics.jsonl") for r in runs] for key, runs in groups.items()}
    label = {key: (f"{key[0]} lr={key[1]:g} wu={key[2]}" if grid else key[0]) for key in groups}
    plot_loss_curves({label[k]: m for k, m in metrics.items()}, out / "loss_curves.png")
    plot_layer_profiles({label[k]: m[0] for k, m in metrics.items()
                         if any(r["split"] == "train" for r in m[0])}, out / "layers.png")
    text = ["# Normalization ablation", "", f"Seeds: {study.seeds}. Values are mean ± std over seeds of the final "
            "validation evaluation; a diverged run (non-finite loss) is excluded from the mean and counted.", "",
            results_table(groups, grid), ""]
    if grid:
        text += ["## Stability grid (final val loss, mean over seeds; X = a seed diverged)", ""]
        for variant in study.variants:
            values = np.array([[np.nan if any(r["diverged"] or r["val_loss"] is None for r in groups[variant, lr, w])
                                else statistics.mean(r["val_loss"] for r in groups[variant, lr, w])
                                for w in study.warmup_steps] for lr in study.learning_rates])
            path = out / f"grid-{variant}.png"
            plot_grid(values, [f"lr {lr:g}" for lr in study.learning_rates],
                      [f"warmup {w}" for w in study.warmup_steps], path, variant)
            text.append(f"![{variant}]({path.name})")
        text.append("")
    text += ["![loss curves](loss_curves.png)", "", "![per-layer](layers.png)", ""]
    (out / "results.md").write_text("\n".join(text))
    (out / "results.json").write_text(json.dumps([r for runs in groups.values() for r in runs], indent=1))
    print("\n" + results_table(groups, grid) + f"\n\nwrote {out / 'results.md'}")


def main() -> None:
    study, base = parse_args()
    groups: dict[tuple, list[dict]] = {}
    for lr in study.learning_rates:
        for warmup in study.warmup_steps:
            for variant in study.variants:
                for seed in study.seeds:
                    summary = run_one(base, study, variant, lr, warmup, seed)
                    if summary["interrupted"]:
                        print("study interrupted; run the same command again to continue where it stopped")
                        return
                    if "out_dir" in summary:  # rank 0's full summary (other DDP ranks only get the outcome)
                        groups.setdefault((variant, lr, warmup), []).append(summary)
    if groups:
        report(study, groups)


if __name__ == "__main__":
    run_cli(main)
