"""Compare two fair studies of the same variants, e.g. under Muon and under AdamW: does the second factor
change which variant wins, by more than the seeds' spread (a paired t-test, study/lr_tuning.py)?

    python scripts/compare_studies.py docs/results/muon/muon docs/results/muon/adamw --labels Muon AdamW

Each folder is one scripts/run_ablation.py --tune_lr wrote (tuning.json, results.json); prints the table in
markdown.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, run_cli
from study import lr_tuning
from study.report import chosen_runs, markdown_table, mean_std, paired_cells, trained_losses


def compare(a: Path, b: Path, labels: tuple[str, str], baseline: str) -> str:
    """The comparison as markdown: per variant each study's choice, the paired difference between the studies,
    each one's paired Δ against the baseline, whether that Δ holds in both, and how much the second factor
    changes it (the interaction: Δ in a − Δ in b, seed by seed)."""
    studies = chosen_runs(a), chosen_runs(b)
    variants = [v for v in studies[0] if v in studies[1]]
    rows = []
    for variant in variants:
        cells, deltas = [], []  # deltas: per study, (its differences by seed, the Stats its verdict rests on)
        for t, runs in (study[variant] for study in studies):
            ok = trained_losses(runs)
            loss = mean_std(ok) if ok else "plateau" if runs or t["chosen_lr"] is None else "—"
            cells.append(f"{t['chosen_lr']:g}, {loss}" if t["chosen_lr"] else loss)
        cells += paired_cells(*lr_tuning.paired_runs(*(study[variant][1] for study in studies)),
                              *(study[variant][0] for study in studies))[0]
        for study in studies:
            if variant == baseline or baseline not in study:
                cells += ["—", "—"]
                continue
            d, left_out = lr_tuning.paired_runs(study[variant][1], study[baseline][1])
            cell, _, verdict_stats = paired_cells(d, left_out, study[variant][0], study[baseline][0])
            deltas += [(d, verdict_stats)] if d else []
            cells += cell[:2]
        if len(deltas) < 2:
            rows.append([variant, *cells, "—", "—", "—", "—"])
            continue
        cells.append("✓" if lr_tuning.resolved(*(s for _, s in deltas)) else "no")
        (da, _), (db, _) = deltas
        records = [study[v][0] for study in studies for v in (variant, baseline)]
        rows.append([variant, *cells, *paired_cells({s: da[s] - db[s] for s in da.keys() & db.keys()}, 0,
                                                    *records)[0]])
    head = ["variant", *(f"{label}: lr, loss" for label in labels),
            f"{labels[0]} − {labels[1]}: mean [95% CI], p, n", "fresh seeds", "resolved",
            *(f"{c}, {label}" for label in labels for c in (f"Δ vs {baseline}", "fresh")),
            f"Δ resolved in both (p < {lr_tuning.ACROSS_ALPHA}, same sign)",
            f"Δ {labels[0]} − Δ {labels[1]}: mean [95% CI], p, n", "fresh seeds", "resolved"]
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("a", type=Path, help="the first study folder (tuning.json, results.json)")
    p.add_argument("b", type=Path, help="the second study folder, of the same variants")
    p.add_argument("--labels", nargs=2, default=("A", "B"),
                   help="what the two studies differ in, e.g. Muon AdamW")
    p.add_argument("--baseline", default="pre-rmsnorm", help="the variant the Δ columns are taken against")
    args = p.parse_args(argv)
    print(compare(args.a, args.b, tuple(args.labels), args.baseline))


if __name__ == "__main__":
    run_cli(main)
