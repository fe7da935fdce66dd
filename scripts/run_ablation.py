"""Normalization ablation: the same training job for several variants, depths and seeds, then plots and a table.

    python scripts/run_ablation.py --out_dir out/ablation --seeds 0 1 2 --max_steps 300
    python scripts/run_ablation.py --variants all --seeds 0
    python scripts/run_ablation.py --variants pre-rmsnorm post-rmsnorm deepnorm-rmsnorm --depths 8 16 32
    python scripts/run_ablation.py --learning_rates 1e-3 3e-3 1e-2 --warmup_steps 0 50   # stability grid

Every run goes through trainer.train_pretrain.train (the same code as `python trainer/train_pretrain.py`),
with identical data, seed list and step budget; any trainer flag passes through. A variant is
<placement>-<norm>, e.g. pre-rmsnorm, post-layernorm, pre+qk_head-rmsnorm, reorder+qk_proj-rmsnorm: a named
placement from PLACEMENTS (the config fields it sets) and a norm type. Finished runs are reused when the study
is re-run with the same out_dir, so an interrupted study picks up where it stopped.
"""

import copy
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from data import load_tokenizer, prepare_split
from model import NORM_POSITIONS, NORM_TYPES
from trainer.args import build_parser, fill_device_defaults, validate
from trainer.checkpoint import find_checkpoints
from trainer.cli import ArgumentParser, UserError, run_cli
from trainer.plots import plot_depth, plot_grid, plot_layer_profiles, plot_loss_curves
from trainer.tracking import read_metrics
from trainer.train_pretrain import train

# A placement names the values of the fields that decide where the norms go; fields it leaves out keep these.
PLACEMENT_DEFAULTS = {"norm_position": "pre", "norm_scaling": "none", "qk_norm": "none", "v_norm": "none"}
PLACEMENTS = {position: {"norm_position": position} for position in NORM_POSITIONS} | {
    "pre+depth": {"norm_scaling": "depth"},  # LayerNorm Scaling ("The Curse of Depth")
    "mix+depth": {"norm_position": "mix", "norm_scaling": "depth"},
    "pre+qk_head": {"qk_norm": "head"},  # Qwen3
    "pre+qk_proj": {"qk_norm": "proj"},
    "peri+qk_head": {"norm_position": "peri", "qk_norm": "head"},  # Gemma 3
    "reorder+qk_proj": {"norm_position": "reorder", "qk_norm": "proj"},  # OLMo 2
    "pre+qkv": {"qk_norm": "head", "v_norm": "head"},  # QKV-norm
    "peri+qkv": {"norm_position": "peri", "qk_norm": "head", "v_norm": "head"},  # Gemma 3n/4's norm positions
}
# "<placement>-<norm>" -> the trainer flags it sets. Names are looked up here, never split on "-".
VARIANTS = {f"{placement}-{norm}": {**PLACEMENT_DEFAULTS, **fields, "norm": norm}
            for placement, fields in PLACEMENTS.items() for norm in sorted(NORM_TYPES)}
DEFAULT_VARIANTS = ["pre-rmsnorm", "pre-layernorm", "post-rmsnorm", "post-layernorm"]
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
                   help=f"<placement>-<norm> names, or 'all' for every combination; placements: "
                        f"{' '.join(PLACEMENTS)}; norms: {' '.join(sorted(NORM_TYPES))}")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="each variant runs once per seed")
    p.add_argument("--depths", nargs="+", type=int, default=None,
                   help="depth study: numbers of blocks, one run per depth (default: the trainer's "
                        "--num_hidden_layers)")
    p.add_argument("--learning_rates", nargs="+", type=float, default=None,
                   help="stability grid: peak learning rates (default: the trainer's --learning_rate)")
    p.add_argument("--warmup_steps", nargs="+", type=int, default=None,
                   help="stability grid: warmup lengths (default: the trainer's --warmup_steps)")
    p.add_argument("--out_dir", default="out/ablation", help="study folder: runs/, plots, results.md")
    own, rest = p.parse_known_args(argv)
    variants = list(VARIANTS) if own.variants == ["all"] else own.variants
    for v in variants:
        if v not in VARIANTS:
            raise UserError(f"unknown variant {v!r}: a variant is <placement>-<norm> with placement one of "
                            f"{', '.join(PLACEMENTS)} and norm one of {', '.join(sorted(NORM_TYPES))}; or 'all'")
    trainer_args = fill_device_defaults(build_parser().parse_args(rest))
    if set(SET_PER_RUN) & {a.split("=")[0] for a in rest}:
        raise UserError(f"{', '.join(SET_PER_RUN)} are set per run by the study; use --seeds and --variants "
                        "(finished runs are reused automatically)")
    own.variants = variants
    own.depths = own.depths or [trainer_args.num_hidden_layers]
    own.learning_rates = own.learning_rates or [trainer_args.learning_rate]
    own.warmup_steps = own.warmup_steps or [trainer_args.warmup_steps]
    if any(d < 1 for d in own.depths):
        raise UserError(f"--depths must be positive integers, got {own.depths}")
    if any(lr <= 0 for lr in own.learning_rates) or any(w < 0 for w in own.warmup_steps):
        raise UserError("--learning_rates must be > 0 and --warmup_steps >= 0")
    return own, trainer_args


def run_name(variant: str, depth: int, lr: float, warmup: int, seed: int) -> str:
    return f"{variant}-L{depth}-lr{lr:g}-wu{warmup}-s{seed}"


# Flags that do not change what a run computes, so a finished run made with other values is still valid.
BOOKKEEPING = {"out_dir", "resume", "overwrite", "keep_checkpoints", "use_wandb", "wandb_project", "wandb_run_name",
               "wandb_group", "num_proc", "dist_timeout"}


def run_one(base, study, variant: str, depth: int, lr: float, warmup: int, seed: int) -> dict:
    """Train one configuration (or reuse its finished result) and return its summary."""
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
    args.wandb_run_name = name
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
    print(f"\n=== {name}")
    return train(validate(args))


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


def results_table(groups: dict[tuple, list[dict]], grid: bool) -> str:
    head = ["variant", "layers", *(["lr", "warmup"] if grid else []), "val loss", "val bpb", "tokens/s", "s/step",
            "norm params", "diverged", "plateaued"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (variant, depth, lr, warmup), runs in groups.items():
        ok = [r for r in runs if not r["diverged"] and r["val_loss"] is not None]
        row = [variant, str(depth), *([f"{lr:g}", str(warmup)] if grid else []),
               mean_std([r["val_loss"] for r in ok]), mean_std([r["val_bpb"] for r in ok]),
               f"{statistics.mean(r['tokens_per_s'] for r in ok):.0f}" if ok else "—",
               f"{statistics.mean(r['s_per_step'] for r in ok):.3f}" if ok else "—",
               f"{runs[0]['norm_params']:,}", f"{sum(r['diverged'] for r in runs)}/{len(runs)}",
               f"{sum(r['plateaued'] for r in runs)}/{len(runs)}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def report(study, base, groups: dict[tuple, list[dict]]) -> None:
    out = Path(study.out_dir)
    grid = len(study.learning_rates) > 1 or len(study.warmup_steps) > 1
    metrics = {key: [read_metrics(Path(r["out_dir"]) / "metrics.jsonl") for r in runs] for key, runs in groups.items()}
    unigram = unigram_loss(base)
    for key, runs in groups.items():
        for run, records in zip(runs, metrics[key], strict=True):
            run["plateaued"] = plateaued(run, records, unigram)

    def label(variant, depth, lr, warmup, with_depth=True):
        return " ".join([variant, *([f"L{depth}"] if with_depth and len(study.depths) > 1 else []),
                         *([f"lr={lr:g} wu={warmup}"] if grid else [])])

    plot_loss_curves({label(*k): m for k, m in metrics.items()}, out / "loss_curves.png")
    plot_layer_profiles({label(*k): m[0] for k, m in metrics.items()
                         if any(r["split"] == "train" for r in m[0])}, out / "layers.png")
    text = ["# Normalization ablation", "", f"Seeds: {study.seeds}. Values are mean ± std over seeds of the final "
            "validation evaluation; a diverged run (non-finite loss) is excluded from the mean and counted. A run "
            f"plateaued when its final validation loss is within {PLATEAU_MARGIN} nats of a unigram model's "
            f"({unigram:.3f}: training-split token frequencies, scored on the validation split) or no lower than "
            "at its first evaluation.", "", results_table(groups, grid), ""]
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
    print("\n" + results_table(groups, grid) + f"\n\nwrote {out / 'results.md'}")


def main(argv: list[str] | None = None) -> None:
    study, base = parse_args(argv)
    groups: dict[tuple, list[dict]] = {}
    for depth in study.depths:
        for lr in study.learning_rates:
            for warmup in study.warmup_steps:
                for variant in study.variants:
                    for seed in study.seeds:
                        summary = run_one(base, study, variant, depth, lr, warmup, seed)
                        if summary["interrupted"]:
                            print("study interrupted; run the same command again to continue where it stopped")
                            return
                        if "out_dir" in summary:  # rank 0's full summary (other DDP ranks only get the outcome)
                            groups.setdefault((variant, depth, lr, warmup), []).append(summary)
    if groups:
        report(study, base, groups)


if __name__ == "__main__":
    run_cli(main)
