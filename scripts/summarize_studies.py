"""One page over several fair studies (scripts/run_ablation.py --tune_lr folders) that differ in optimizer and
token budget: per variant and optimizer, the chosen lr, the loss and the paired difference against the
baseline with its 95% CI, p and n, at each budget; a CSV of it; a forest plot, the optimizer interaction
plot (given both optimizers) and each study's lr sensitivity.

    python scripts/summarize_studies.py docs/results/budget/{adamw,muon}-{400,1600} --out docs/results/budget

A folder's optimizer and steps are read from its runs. The verdict ("resolved") is lr_tuning's rule on the
fresh seeds (those that took no part in choosing either lr) where there are 2 or more.
"""

import csv
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, run_cli
from common.environment import describe, environment
from common.fs import write_atomically
from study import lr_tuning
from study.plots import plot_forest, plot_interaction, plot_lr_sensitivity
from study.report import chosen_runs, markdown_table, mean_std, stats_cell, trained_losses

FIELDS = ["variant", "optimizer", "steps", "chosen_lr", "loss_mean", "loss_sd", "n", "delta", "ci_low",
          "ci_high", "p", "n_pairs", "fresh_delta", "fresh_ci_low", "fresh_ci_high", "fresh_p", "fresh_n",
          "resolved"]


def study_rows(folder: Path, baseline: str) -> list[dict]:
    """One row per variant of a study folder (one depth): its choice, loss and Δ against the baseline."""
    chosen = chosen_runs(folder)
    first = next(r for _, runs in chosen.values() for r in runs)
    optimizer, steps = first["args"]["optimizer"], first["args"]["max_steps"]
    rows = []
    for variant, (t, mine) in chosen.items():
        ok = trained_losses(mine)
        row = {"variant": variant, "optimizer": optimizer, "steps": steps, "chosen_lr": t["chosen_lr"],
               "loss_mean": sum(ok) / len(ok) if ok else None, "loss_sd": mean_std(ok), "n": len(ok),
               "record": t, "runs": mine}
        if variant != baseline and baseline in chosen:
            differences, _ = lr_tuning.paired_runs(mine, chosen[baseline][1])
            whole = lr_tuning.paired_stats(differences)
            new = lr_tuning.paired_stats(lr_tuning.fresh(differences, t, chosen[baseline][0]))
            row |= {"delta": whole, "fresh": new, "resolved": lr_tuning.resolved(new) if new.n >= 2 else None}
        rows.append(row)
    return rows


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        flat = dict(row, loss_sd=row["loss_sd"].partition(" ± ")[2] or None)
        for prefix, key in (("", "delta"), ("fresh_", "fresh")):
            if stats := row.get(key):
                flat |= {f"{prefix}delta": stats.mean, f"{prefix}ci_low": stats.ci_low,
                         f"{prefix}ci_high": stats.ci_high, f"{prefix}p": stats.p,
                         "n_pairs" if key == "delta" else "fresh_n": stats.n}
        writer.writerow(flat)
    return out.getvalue()


def summary_table(rows: list[dict], baseline: str) -> str:
    """Variant x optimizer, one block of columns per token budget."""
    budgets = sorted({r["steps"] for r in rows})
    head = ["variant", "optimizer"] + [f"{c} ({steps} steps)" for steps in budgets for c in (
        "lr", "loss (n)", f"Δ vs {baseline}, fresh seeds: mean [95% CI], p, n", "resolved")]
    cells = {(r["variant"], r["optimizer"], r["steps"]): r for r in rows}
    table = []
    for variant, optimizer in dict.fromkeys((r["variant"], r["optimizer"]) for r in rows):
        line = [variant, optimizer]
        for steps in budgets:
            r = cells.get((variant, optimizer, steps))
            if r is None:
                line += ["—"] * 4
                continue
            verdict = {True: "✓", False: "no", None: "—"}[r.get("resolved")]
            line += [f"{r['chosen_lr']:g}" if r["chosen_lr"] else "none", f"{r['loss_sd']} ({r['n']})",
                     stats_cell(r["fresh"]) if "fresh" in r else "—", verdict]
        table.append(line)
    return markdown_table(head, table)


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("folders", nargs="+", type=Path, help="study folders written by run_ablation.py --tune_lr")
    p.add_argument("--baseline", default="pre-rmsnorm", help="the variant every Δ is taken against")
    p.add_argument("--out", type=Path, default=Path("out/summary"),
                   help="writes summary.md, summary.csv, figures")
    args = p.parse_args(argv)
    rows = [row for folder in args.folders for row in study_rows(folder, args.baseline)]
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out / "summary.csv", csv_text(rows))
    plot_forest([r for r in rows if "fresh" in r], args.out / "forest.png")
    figures = []
    if len({r["optimizer"] for r in rows}) > 1:  # the interaction needs studies under both optimizers
        plot_interaction([r for r in rows if "fresh" in r], args.out / "interaction.png")
        figures.append("![AdamW against Muon](interaction.png)")
    for folder in args.folders:
        tuning = json.loads((folder / "tuning.json").read_text())
        if any("lr_from" in t for t in tuning):
            continue  # its lrs were chosen, and are drawn, in another study
        name = f"lr_sensitivity-{folder.name}.png"
        plot_lr_sensitivity(tuning, args.out / name, title=folder.name)
        figures.append(f"![lr sensitivity, {folder.name}]({name})")
    dirty = sum(r.get("environment", {}).get("git_dirty") is not False for row in rows for r in row["runs"])
    text = ["# Summary of the studies", "", describe(environment()), "",
            f"Studies: {', '.join(f'`{f}`' for f in args.folders)}. Runs at the chosen lrs: "
            f"{sum(len(r['runs']) for r in rows)}, {dirty} of them from a modified tree.", "",
            summary_table(rows, args.baseline), "", "![forest plot](forest.png)", "", *figures, ""]
    write_atomically(args.out / "summary.md", "\n".join(text))
    print(summary_table(rows, args.baseline) + f"\nwrote {args.out / 'summary.md'}, summary.csv and figures")


if __name__ == "__main__":
    run_cli(main)
