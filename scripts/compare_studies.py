"""Compare two fair studies of the same variants, e.g. under Muon and under AdamW: does the second factor change which
variant wins, by more than the floor of the machine's rounding?

    python scripts/compare_studies.py docs/results/muon/muon docs/results/muon/adamw --labels Muon AdamW

Each folder is one scripts/run_ablation.py --tune_lr wrote (tuning.json, results.json); prints the table in markdown.
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli
from study import lr_tuning
from study.report import markdown_table, mean_std, paired_cells

# The same run (same seed and flags) on another CPU type ends up to this far from the recorded loss: 0.021 nats under
# Muon, whose Newton-Schulz iteration rounds in bf16 (docs/results/muon.md). A smaller difference may be the
# machine's rounding rather than the variant.
DEFAULT_FLOOR = 0.021


def chosen_runs(folder: Path) -> dict[str, tuple[float | None, list[dict]]]:
    """variant -> (the chosen lr, its runs at that lr) of a study folder (one depth)."""
    rows = json.loads((folder / "results.json").read_text())
    return {t["variant"]: (t["chosen_lr"], [r for r in rows if r["variant"] == t["variant"] and r["depth"] == t["depth"]
                                            and r["args"]["learning_rate"] == t["chosen_lr"]])
            for t in json.loads((folder / "tuning.json").read_text())}


def ranks(values: dict[str, float]) -> dict[str, float]:
    """1 for the lowest value; tied values share the mean of their places."""
    ordered = sorted(values.values())
    return {name: statistics.mean(i + 1 for i, v in enumerate(ordered) if v == value) for name, value in values.items()}


def spearman(a: dict[str, float], b: dict[str, float]) -> float | None:
    """Spearman's rank correlation of two scores over their common keys (None below 3 of them)."""
    common = sorted(a.keys() & b.keys())
    if len(common) < 3:
        return None
    ra, rb = ranks({k: a[k] for k in common}), ranks({k: b[k] for k in common})
    return statistics.correlation([ra[k] for k in common], [rb[k] for k in common])


def compare(a: Path, b: Path, labels: tuple[str, str], baseline: str, floor: float) -> str:
    """The comparison as markdown: per variant each study's choice, the paired difference between the studies and
    each one's paired Δ against the baseline; then the rank correlation of the Δ orderings and the pairs that swap."""
    studies = chosen_runs(a), chosen_runs(b)
    variants = [v for v in studies[0] if v in studies[1]]
    deltas: tuple[dict, dict] = ({}, {})
    resolved: tuple[dict, dict] = ({}, {})
    rows = []
    for variant in variants:
        cells = []
        for lr, runs in (study[variant] for study in studies):
            ok = [r["val_loss"] for r in runs if not r["diverged"] and not r.get("plateaued")]
            loss = mean_std(ok) if ok else "plateau" if runs or lr is None else "—"
            cells.append(f"{lr:g}, {loss}" if lr else loss)
        cells += paired_cells(*lr_tuning.paired_runs(studies[0][variant][1], studies[1][variant][1]))
        for study, delta, clear in zip(studies, deltas, resolved, strict=True):
            if variant == baseline or baseline not in study:
                cells.append("—")
                continue
            d, left_out, unrecorded = lr_tuning.paired_runs(study[variant][1], study[baseline][1])
            if d.mean is not None:
                delta[variant] = d.mean
                clear[variant] = abs(d.mean) > floor and d.agreeing == len(d.differences) > 1
            cells.append(paired_cells(d, left_out, unrecorded)[0])
        rows.append([variant, *cells])
    rho = spearman(*deltas)
    swaps = [f"{x} / {y}" for i, x in enumerate(variants) for y in variants[i + 1:]
             if all(v in d for d in deltas for v in (x, y))
             and (deltas[0][x] - deltas[0][y]) * (deltas[1][x] - deltas[1][y]) < 0]
    cleared = [s for s in swaps if all(clear[v] for clear in resolved for v in s.split(" / "))]
    head = ["variant", *(f"{label}: lr, loss" for label in labels), f"{labels[0]} − {labels[1]} (paired)",
            "seeds agreeing", *(f"Δ vs {baseline}, {label}" for label in labels)]
    return "\n".join([markdown_table(head, rows), "",
                      f"Rank correlation (Spearman) of the Δ vs {baseline} orderings, over the "
                      f"{len(deltas[0].keys() & deltas[1].keys())} variants both studies resolve: "
                      + ("—" if rho is None else f"{rho:+.2f}") + ".",
                      f"Pairs whose order swaps: {', '.join(swaps) or 'none'}; of them, with every Δ beyond the floor "
                      f"({floor:g} nats) and all seeds agreeing in both studies: {', '.join(cleared) or 'none'}."])


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("a", type=Path, help="the first study folder (tuning.json, results.json)")
    p.add_argument("b", type=Path, help="the second study folder, of the same variants")
    p.add_argument("--labels", nargs=2, default=("A", "B"), help="what the two studies differ in, e.g. Muon AdamW")
    p.add_argument("--baseline", default="pre-rmsnorm", help="the variant the Δ columns are taken against")
    p.add_argument("--floor", type=float, default=DEFAULT_FLOOR,
                   help="nats below which a difference is not called resolved (the cross-machine floor)")
    args = p.parse_args(argv)
    for folder in (args.a, args.b):
        missing = [name for name in ("tuning.json", "results.json") if not (folder / name).is_file()]
        if missing:
            raise UserError(f"{folder} has no {' or '.join(missing)}: pass a folder scripts/run_ablation.py --tune_lr "
                            "wrote (its report is written when the study's runs are finished)")
    print(compare(args.a, args.b, tuple(args.labels), args.baseline, args.floor))


if __name__ == "__main__":
    run_cli(main)
