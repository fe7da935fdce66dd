"""A study's report: results.md (the tables and figures), results.json (every run's summary), tuning.json with
--tune_lr, and the tables printed at the end."""

import json
import statistics
from pathlib import Path

import numpy as np

from common.environment import describe, environment
from study import lr_tuning, runner
from study.plots import plot_depth, plot_grid, plot_loss_curves, plot_lr_sensitivity
from trainer.plots import plot_layer_profiles
from trainer.tracking import read_metrics


def mean_std(values: list[float]) -> str:
    if len(values) > 1:
        return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
    return f"{values[0]:.3f}" if values else "—"


def speed(runs: list[dict]) -> tuple[str, str]:
    """Mean tokens/s and s/step of the runs that timed a step (a one-step run has only its warm-up step)."""
    timed = [r for r in runs if r["tokens_per_s"] is not None]
    if not timed:
        return "—", "—"
    return (f"{statistics.mean(r['tokens_per_s'] for r in timed):.0f}",
            f"{statistics.mean(r['s_per_step'] for r in timed):.3f}")


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(row) + " |" for row in rows)])


def outcomes(runs: list[dict]) -> list[str]:
    """The diverged and the plateaued cells: how many of the runs did."""
    return [f"{sum(r[key] for r in runs)}/{len(runs)}" for key in ("diverged", "plateaued")]


def results_table(groups: dict[tuple, list[dict]], grid: bool) -> str:
    head = ["variant", "layers", *(["lr", "warmup"] if grid else []), "val loss", "val bpb", "tokens/s", "s/step",
            "norm params", "diverged", "plateaued"]
    rows = []
    for (variant, depth, lr, warmup), runs in groups.items():
        ok = [r for r in runs if not r["diverged"] and r["val_loss"] is not None]
        rows.append([variant, str(depth), *([f"{lr:g}", str(warmup)] if grid else []),
                     mean_std([r["val_loss"] for r in ok]), mean_std([r["val_bpb"] for r in ok]), *speed(ok),
                     f"{runs[0]['norm_params']:,}", *outcomes(runs)])
    return markdown_table(head, rows)


def paired_cells(d: lr_tuning.PairedDifference, left_out: int, unrecorded: bool) -> tuple[str, str]:
    """A paired difference (lr_tuning.paired_runs) as two table cells: 'mean ± std', and the seeds agreeing with
    how the seeds paired."""
    spread = f" ± {d.std:.3f}" if d.std is not None else ""
    diff = f"{d.mean:+.3f}{spread}" if d.differences else "—"
    if not d.differences and not left_out:
        return diff, "—"
    notes = []
    if left_out:
        notes.append(f"{left_out} across CPU types left out")
    if unrecorded:
        notes.append("CPU type not recorded")
    return diff, f"{d.agreeing}/{len(d.differences)}" + (f" ({'; '.join(notes)})" if notes else "")


def fair_table(groups: dict[tuple, list[dict]], tuning: list[dict], baseline: str) -> str:
    """--tune_lr: each (variant, depth) at its chosen lr, with its usable range and the paired difference."""
    head = ["variant", "layers", "chosen lr", f"usable lrs (≤ {lr_tuning.USABLE_MARGIN} nats from best)",
            "val loss", "min–max", f"Δ vs {baseline} (paired)", "seeds agreeing", "diverged", "plateaued"]
    runs_at = {(variant, depth): runs for (variant, depth, _, _), runs in groups.items()}
    rows = []
    for t in tuning:
        runs = runs_at.get((t["variant"], t["depth"]), [])
        ok = [r["val_loss"] for r in runs if not r["diverged"] and r["val_loss"] is not None]
        usable = t["usable_range"]
        span = (f"{min(usable):g}–{max(usable):g}" if len(usable) > 1 else f"{usable[0]:g}") if usable else "—"
        base_runs = runs_at.get((baseline, t["depth"]))
        paired = (paired_cells(*lr_tuning.paired_runs(runs, base_runs))
                  if runs and base_runs and t["variant"] != baseline else ("—", "—"))
        edge = " (edge)" if t["at_edge"] else ""
        chosen = "none usable" if t["chosen_lr"] is None else f"{t['chosen_lr']:g}{edge}"
        rows.append([t["variant"], str(t["depth"]), chosen, f"{span} ({len(usable)} of {len(t['learning_rates'])})",
                     mean_std(ok), f"{min(ok):.3f}–{max(ok):.3f}" if ok else "—", *paired, *outcomes(runs)])
    return markdown_table(head, rows)


def study_cost(out: Path) -> str:
    """How much training the study folder holds: finished runs and their summed training time."""
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/summary.json"))]
    hours = sum(r["train_time_s"] + r.get("compile_time_s", 0.0) for r in runs) / 3600
    return (f"The study folder holds {len(runs)} finished runs, {hours:.1f} hours of training in all (each run's "
            "train_time_s plus its warm-up step), evaluation and start-up not counted.")


def report(study, base, groups: dict[tuple, list[dict]], tuning: list[dict] | None = None) -> None:
    """Write the study folder's report of the finished groups (and, with --tune_lr, every choice made) and print
    its tables."""
    out = Path(study.out_dir)
    grid = len(study.learning_rates) > 1 or len(study.warmup_steps) > 1
    metrics = {key: [read_metrics(Path(r["out_dir"]) / "metrics.jsonl") for r in runs] for key, runs in groups.items()}
    unigram = runner.unigram_loss(base)
    for key, runs in groups.items():
        for run, records in zip(runs, metrics[key], strict=True):
            run["plateaued"] = runner.plateaued(run, records, unigram)

    def label(variant, depth, lr, warmup, with_depth=True):
        return " ".join([variant, *([f"L{depth}"] if with_depth and len(study.depths) > 1 else []),
                         *([f"lr={lr:g} wu={warmup}"] if grid else [])])  # tuned: one lr per variant

    plot_loss_curves({label(*k): m for k, m in metrics.items()}, out / "loss_curves.png")
    plot_layer_profiles({label(*k): m[0] for k, m in metrics.items()
                         if any(r["split"] == "train" for r in m[0])}, out / "layers.png")
    text = ["# Normalization ablation", "", describe(environment()) + " Each run's own is in results.json.", "",
            f"Seeds: {study.seeds}. Values are mean ± std over seeds of the final validation evaluation; a diverged "
            "run (non-finite loss, or a finite one that blew up; docs/training.md) is excluded from the mean and "
            f"counted. A run plateaued when its final validation loss is within {runner.PLATEAU_MARGIN} nats of a "
            f"unigram model's ({unigram:.3f}: training-split token frequencies, scored on the validation split) or "
            "no lower than at its first evaluation.", ""]
    fair = ""
    if tuning is not None:
        (out / "tuning.json").write_text(json.dumps(tuning, indent=1))
        plot_lr_sensitivity(tuning, out / "lr_sensitivity.png")
        fair = fair_table(groups, tuning, study.baseline)
        text += ["## Each variant at its own best learning rate", "",
                 f"Learning rates tried with seed {study.seeds[0]}: {' '.join(f'{lr:g}' for lr in study.tune_lr)} "
                 "(the grid grows by ×2 or ÷2 past an edge that wins, or ÷2 below it when no lr trains, at most "
                 f"{lr_tuning.MAX_EXTENSIONS} times; '(edge)' marks a choice still at the edge). The chosen lr has "
                 "the lowest final validation loss among runs that neither diverged nor plateaued; the other seeds "
                 f"trained at it only. Δ is the variant's final validation loss minus {study.baseline}'s on the same "
                 "seed (same initialization seed and data order), mean ± std over seeds; 'seeds agreeing' counts the "
                 "seeds whose difference has the sign of the mean. A seed pairs only where both runs ran on the same "
                 "CPU type (model and AVX2 / AVX-512 / AMX, from each run's summary): other kernels round "
                 "differently, by as much as the smallest effects here; runs recorded before the CPU type was pair "
                 "as before, and say so.", "", study_cost(out), "", fair, "", "![lr sensitivity](lr_sensitivity.png)", ""]
    table = results_table(groups, grid or tuning is not None)
    text += [table, ""]
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
                values = np.array([[np.nan if any(r["diverged"] or r["val_loss"] is None for r in runs)
                                    else statistics.mean(r["val_loss"] for r in runs)
                                    for runs in (groups[variant, depth, lr, w] for w in study.warmup_steps)]
                                   for lr in study.learning_rates])
                name = f"{variant}-L{depth}"
                plot_grid(values, [f"lr {lr:g}" for lr in study.learning_rates],
                          [f"warmup {w}" for w in study.warmup_steps], out / f"grid-{name}.png", name)
                text.append(f"![{name}](grid-{name}.png)")
        text.append("")
    text += ["![loss curves](loss_curves.png)", "", "![per-layer](layers.png)", ""]
    (out / "results.md").write_text("\n".join(text))
    rows = [{"variant": variant, "depth": depth, **r} for (variant, depth, _, _), runs in groups.items() for r in runs]
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n" + "\n\n".join(part for part in (fair, table, f"wrote {out / 'results.md'}") if part))
