"""A study's report: results.md (the tables and figures), results.json (every run's summary), tuning.json with
--tune_lr, and the tables printed at the end."""

import json
import math
import statistics
import sys
from pathlib import Path

from common.cli import UserError
from common.environment import describe, environment
from common.fs import write_atomically
from study import claims, lr_tuning
from study.plots import plot_depth, plot_grid, plot_loss_curves, plot_lr_sensitivity
from trainer import evaluation
from trainer.plots import plot_layer_profiles
from trainer.tracking import read_metrics


def mean_std(values: list[float]) -> str:
    if len(values) > 1:
        return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
    return f"{values[0]:.3f}" if values else "—"


def trained_losses(runs: list[dict]) -> list[float]:
    """The final losses of the runs that neither diverged nor plateaued: what the tables average."""
    return [r["val_loss"] for r in runs if not r["diverged"] and not r.get("plateaued")]


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
    """The diverged and the plateaued cells: how many of the runs did (— with none: a grid's failures are
    in its own column)."""
    if not runs:
        return ["—", "—"]
    return [f"{sum(r[key] for r in runs)}/{len(runs)}" for key in ("diverged", "plateaued")]


def results_table(groups: dict[tuple, list[dict]], grid: bool) -> str:
    head = ["variant", "layers", *(["lr", "warmup"] if grid else []), "val loss: mean ± SD", "val bpb",
            "tokens/s", "s/step", "norm params", "diverged", "plateaued"]
    rows = []
    for (variant, depth, lr, warmup), runs in groups.items():
        ok = [r for r in runs if not r["diverged"] and not r.get("plateaued")]
        mark = ""
        if not ok:  # a short run plateaus by rule (one evaluation): its losses still show, marked
            ok = [r for r in runs if not r["diverged"] and r["val_loss"] is not None]
            mark = " (plateaued)" if ok else ""
        losses = [mean_std([r[key] for r in ok]) + mark for key in ("val_loss", "val_bpb")]
        rows.append([variant, str(depth), *([f"{lr:g}", str(warmup)] if grid else []), *losses,
                     *speed(ok), f"{runs[0]['norm_params']:,}", *outcomes(runs)])
    return markdown_table(head, rows)


def earlier_report(out: Path) -> list[dict]:
    """The runs an earlier command reported in the study folder (its results.json), those whose run
    folder is still there; a file that is not such a report is a UserError naming it."""
    path = out / "results.json"
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text())
        names = [Path(r["out_dir"]).name for r in rows]
    except (ValueError, TypeError, KeyError) as err:
        raise UserError(f"{path} is not a study's report ({type(err).__name__}: {err}); restore it, or "
                        "move it away and run the study again to rebuild it") from None
    kept = [r for r, name in zip(rows, names, strict=True)
            if (out / "runs" / name / "summary.json").is_file()]
    for name in sorted(set(names) - {Path(r["out_dir"]).name for r in kept}):
        print(f"warning: {out / 'runs' / name} is gone; the report leaves it out", file=sys.stderr)
    return kept


def lr_grid_cell(record: dict) -> str:
    """Every lr the grid tried, with the tune seeds' mean final val loss there ('failed' where a seed
    diverged or plateaued)."""
    points = zip(record["learning_rates"], record["val_losses"], record["usable"], strict=True)
    return ", ".join(f"{lr:g}: {loss:.3f}" if usable else f"{lr:g}: failed"
                     for lr, loss, usable in points)


def starting_grids(study) -> str:
    """The lrs each variant's tuning started from: --tune_lr, and the grids --tune_lr_for gives its own."""
    def listed(lrs):  # as the runner tries them
        return " ".join(f"{lr:g}" for lr in sorted(lrs))
    own = [f"{variant}: {listed(lrs)}" for variant, lrs in study.tune_lr_for.items()]
    if all(variant in study.tune_lr_for for variant in study.variants):
        return "; ".join(own)
    return "; ".join([listed(study.tune_lr), *own])


def fair_table(groups: dict[tuple, list[dict]], tuning: list[dict], baseline: str) -> str:
    """--tune_lr: each (variant, depth) at its chosen lr, with its usable range and its difference against the
    baseline on the fresh seeds, by the claims' statistics (study/claims.py)."""
    head = ["variant", "layers", "lr grid: mean val loss of the tune seeds", "chosen lr",
            f"usable lrs (≤ {lr_tuning.USABLE_MARGIN} nats from best)",
            "val loss, fresh seeds: mean ± SD (n)",
            f"Δ val loss vs {baseline}: mean [{claims.CONFIDENCE:.0%} CI], p", "fresh seeds (failed)",
            "Δ train loss", "diverged", "plateaued"]
    runs_at = {(variant, depth): runs for (variant, depth, _, _), runs in groups.items()}
    records = {(t["variant"], t["depth"]): t for t in tuning}
    rows = []
    for t in tuning:
        runs = runs_at.get((t["variant"], t["depth"]), [])
        ok = trained_losses([r for r in runs if r["seed"] not in t.get("tune_seeds", [0])])
        usable = t["usable_range"]
        span = f"{min(usable):g}–{max(usable):g}" if len(usable) > 1 else f"{usable[0]:g}" if usable else "—"
        base = claims.Side(records.get((baseline, t["depth"])), runs_at.get((baseline, t["depth"]), []))
        paired = ["—"] * 3
        if runs and base.runs and t["variant"] != baseline:
            d = claims.difference(claims.Side(t, runs), base)
            paired = [claims.cell(d["val"]), f"{d['seeds']} ({d['failed']})", claims.cell(d["train"])]
        edge = " (edge)" if t["at_edge"] else ""
        chosen = "none usable" if t["chosen_lr"] is None else f"{t['chosen_lr']:g}{edge}"
        tried = f"{span} ({len(usable)} of {len(t['learning_rates'])})"
        rows.append([t["variant"], str(t["depth"]), lr_grid_cell(t), chosen, tried,
                     f"{mean_std(ok)} ({len(ok)})" if ok else "—", *paired, *outcomes(runs)])
    return markdown_table(head, rows)


def study_cost(out: Path) -> str:
    """How much training the study folder holds; how many runs a modified tree trained (no commit has it),
    and how many recorded no answer (so none of them can show it came from a commit)."""
    runs = [claims.read_json(p) for p in sorted((out / "runs").glob("*/summary.json"))]
    hours = sum(r["train_time_s"] for r in runs) / 3600
    answers = [r.get("environment", {}).get("git_dirty") for r in runs]
    unrecorded = answers.count(None)
    text = (f"The study folder holds {len(runs)} finished runs, {hours:.1f} hours of training (evaluation "
            f"and start-up not counted); {answers.count(True)} of {len(runs)} runs were trained from a "
            "modified tree")
    if unrecorded:
        text += f", and {unrecorded} recorded no commit"
    return text + "."


def grid_cell(runs: list[dict] | None) -> float | None:
    """A stability grid's cell: the mean final val loss over seeds, NaN where a seed diverged or
    has no loss, None where nothing trained at that lr and warmup."""
    if runs is None:
        return None
    if any(r["diverged"] or r["val_loss"] is None for r in runs):
        return math.nan
    return statistics.mean(r["val_loss"] for r in runs)


def read_tuning(path: Path) -> list[dict]:
    """A study's tuning.json (its lr choices); a damaged one is a UserError naming it."""
    advice = "restore it from the study that wrote it"
    records = claims.read_json(path, advice)
    fields = {"variant", "depth", "chosen_lr"}
    if not (isinstance(records, list) and all(isinstance(r, dict) and fields <= r.keys() for r in records)):
        raise UserError(f"{path} is not a study's tuning.json (another file?); {advice}")
    return records


def none_finished(tuning: list[dict] | None) -> str:
    """What the report says where no group has finished: a tuned study may have no lr to train at."""
    if tuning and all(t["chosen_lr"] is None for t in tuning):
        return "none: no lr of any grid trained on its tune seeds"
    return "none finished yet"


def report(study, groups: dict[tuple, list[dict]], tuning: list[dict] | None = None) -> None:
    """Write the study folder's report of the finished groups (and, with --tune_lr, every choice made), added
    to what an earlier command (other variants, lrs or seeds) reported there, and print its tables."""
    out = Path(study.out_dir)
    earlier = earlier_report(out)
    # the runs an earlier command reported here, in their folders now, then this one's (variants as named)
    rows = {Path(r["out_dir"]).name: {**r, "out_dir": str(out / "runs" / Path(r["out_dir"]).name)}
            for r in earlier}
    rows |= {Path(r["out_dir"]).name: {"variant": variant, "depth": depth, **r} | {"variant": variant}
             for (variant, depth, _, _), runs in groups.items() for r in runs}
    groups = {}
    for r in rows.values():
        key = r["variant"], r["depth"], r["args"]["learning_rate"], r["args"]["warmup_steps"]
        groups.setdefault(key, []).append(r)
    if tuning is not None and (out / "tuning.json").is_file():
        chosen = {(t["variant"], t["depth"]) for t in tuning}
        tuning = [t for t in read_tuning(out / "tuning.json")
                  if (t["variant"], t["depth"]) not in chosen] + tuning
    grid = tuning is None and len({key[2:] for key in groups}) > 1  # lrs or warmups side by side
    depths, seeds = {key[1] for key in groups}, sorted({r["seed"] for runs in groups.values() for r in runs})
    metrics = {key: [read_metrics(Path(r["out_dir"]) / "metrics.jsonl") for r in runs]
               for key, runs in groups.items()}
    # the same for every run: the smoothed token frequencies of the study's data (trainer/evaluation.py)
    # (none before a group finishes: a tuned study whose seeds so far all chose lrs)
    unigram = next((r["unigram_loss"] for runs in groups.values() for r in runs), None)
    unigram_loss = "" if unigram is None else f" ({unigram:.3f})"

    def label(variant, depth, lr, warmup, with_depth=True):
        return " ".join([variant, *([f"L{depth}"] if with_depth and len(depths) > 1 else []),
                         *([f"lr={lr:g} wu={warmup}"] if grid else [])])  # tuned: one lr per variant

    plot_loss_curves({label(*k): m for k, m in metrics.items()}, out / "loss_curves.png")
    # one run per line, its group's first seed: a mean of profiles would be no run's
    plot_layer_profiles({f"{label(*k)} (seed {groups[k][0]['seed']})": m[0] for k, m in metrics.items()
                         if any(r["split"] == "train" for r in m[0])}, out / "layers.png")
    text = ["# Normalization ablation", "", describe(environment()) + " Each run's is in results.json.", "",
            f"Seeds: {seeds or none_finished(tuning)}. Values are mean ± SD over seeds of "
            "the final validation loss; a diverged or plateaued run (docs/training.md) is counted in its "
            "column, not averaged. A run plateaued when its final validation loss is not at least "
            f"{evaluation.PLATEAU_MARGIN} nats below a unigram model's{unigram_loss}, or no lower "
            "than its first.", ""]
    fair = ""
    if tuning is not None:
        write_atomically(out / "tuning.json", json.dumps(tuning, indent=1))
        fair = fair_table(groups, tuning, study.baseline)
        if study.lr_from:
            source = next(iter(study.lr_from.values()))["lr_from"]
            chose = f"Each variant trains at the lr {source} chose (its tuning.json, copied here)."
        else:
            plot_lr_sensitivity(tuning, out / "lr_sensitivity.png")
            chose = (f"Each variant trains at the lr of its grid ({starting_grids(study)}), grown ×2 or ÷2 "
                     f"past a winning edge up to {lr_tuning.MAX_EXTENSIONS} times ('(edge)': still at one), "
                     "with the lowest mean final validation loss over the tune seeds "
                     f"{study.tune_seeds}, where none of them diverged or plateaued.")
        text += ["## Each variant at its own best learning rate", "",
                 f"{chose} Δ is the loss minus {study.baseline}'s on the same seed and CPU type, on "
                 "the fresh seeds only (the tune seeds' luck helped choose the lr); the train loss is the "
                 "mean over the last 10% of steps. A study's report gives statistics only: the "
                 "project's verdicts are computed, by one rule over every claim's primary folder "
                 "under docs/results/, in docs/results/claims.md (python scripts/write_claims.py).", "",
                 study_cost(out), "", fair, "",
                 "" if study.lr_from else "![lr sensitivity](lr_sensitivity.png)", ""]
    shown = groups
    if tuning is not None:  # a tuned study's means are over its fresh seeds: the tune seeds chose the lr
        tuned = {(t["variant"], t["depth"]): t.get("tune_seeds", [0]) for t in tuning}
        fresh = {key: [r for r in runs if r["seed"] not in tuned.get(key[:2], [])]
                 for key, runs in groups.items()}
        shown = {key: runs for key, runs in fresh.items() if runs}
    # e.g. a tuned study whose fresh seeds are still to train: no table of headers alone
    table = (results_table(shown, grid or tuning is not None) if shown
             else f"Runs shown: {none_finished(tuning)}.")
    text += [table, ""]
    if len(depths) > 1:
        lines: dict[str, list[tuple[int, list[dict]]]] = {}
        for (variant, depth, lr, warmup), runs in groups.items():
            lines.setdefault(label(variant, depth, lr, warmup, with_depth=False), []).append((depth, runs))
        plot_depth(lines, out / "depth.png", unigram)
        text += ["## Depth (final val loss, mean and min..max over seeds)", "", "![depth](depth.png)", ""]
    if grid:
        text += ["## Stability grid (final val loss, mean over seeds; X = a seed diverged)", ""]
        for variant, depth in dict.fromkeys(key[:2] for key in groups):
            # (lr, warmup) -> runs; a second command in the folder may leave some pairs untrained
            cells = {key[2:]: runs for key, runs in groups.items() if key[:2] == (variant, depth)}
            lrs = sorted({lr for lr, _ in cells})
            warmups = sorted({warmup for _, warmup in cells})
            values = [[grid_cell(cells.get((lr, warmup))) for warmup in warmups] for lr in lrs]
            name = f"{variant}-L{depth}"
            plot_grid(values, [f"lr {lr:g}" for lr in lrs], [f"warmup {w}" for w in warmups],
                      out / f"grid-{name}.png", name)
            text.append(f"![{name}](grid-{name}.png)")
        text.append("")
    text += ["![loss curves](loss_curves.png)", "", "![per-layer](layers.png)", ""]
    write_atomically(out / "results.md", "\n".join(text))
    write_atomically(out / "results.json", json.dumps(list(rows.values()), indent=1))
    print("\n" + "\n\n".join(part for part in (fair, table, f"wrote {out / 'results.md'}") if part))
