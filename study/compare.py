"""Two studies of the same variants side by side, e.g. one trained under Muon and one under AdamW (same grid,
seeds, steps and data): does the second factor change which variant wins?

Each study is a --tune_lr folder the ablation runner wrote (tuning.json and results.json). Per variant: each
study's chosen lr and final validation loss at it, and the paired difference A − B seed by seed, taken only
between runs of the same CPU type (study/lr_tuning.py); per study, the ranking by the paired Δ against the
baseline variant, the rank correlation of the two rankings, and which pairs of variants swap order between the
studies with both Δs clearing the floor (a difference smaller than the floor could be the machine's rounding).
"""

import json
import statistics
from pathlib import Path

from study import lr_tuning
from study.report import paired_cells


def chosen_runs(folder: Path) -> dict[str, dict]:
    """variant -> {"lr": the chosen lr, "runs": its runs at that lr (summaries)} of a study folder (one depth)."""
    tuning = json.loads((folder / "tuning.json").read_text())
    rows = json.loads((folder / "results.json").read_text())
    chosen = {}
    for t in tuning:
        runs = [r for r in rows if r["variant"] == t["variant"] and r["depth"] == t["depth"]
                and t["chosen_lr"] is not None and r["args"]["learning_rate"] == t["chosen_lr"]]
        chosen[t["variant"]] = {"lr": t["chosen_lr"], "runs": runs, "plateau": t["chosen_lr"] is None}
    return chosen


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
    """The comparison as markdown."""
    studies = chosen_runs(a), chosen_runs(b)
    variants = [v for v in studies[0] if v in studies[1]]
    head = ["variant", *(f"{label}: lr, loss" for label in labels), f"{labels[0]} − {labels[1]} (paired)",
            "seeds agreeing", *(f"Δ vs {baseline}, {label}" for label in labels)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    deltas: tuple[dict, dict] = ({}, {})
    resolved: tuple[dict, dict] = ({}, {})
    for variant in variants:
        cells = []
        for study in studies:
            runs = study[variant]["runs"]
            ok = [r["val_loss"] for r in runs if not r["diverged"] and not r.get("plateaued")]
            loss = (f"{statistics.mean(ok):.3f}" + (f" ± {statistics.stdev(ok):.3f}" if len(ok) > 1 else "")
                    if ok else "plateau" if runs or study[variant]["plateau"] else "—")
            cells.append(f"{study[variant]['lr']:g}, {loss}" if study[variant]["lr"] else loss)
        cells += paired_cells(*lr_tuning.paired_runs(studies[0][variant]["runs"], studies[1][variant]["runs"]))
        for i, study in enumerate(studies):
            if variant == baseline or baseline not in study:
                cells.append("—")
                continue
            d, left_out, unrecorded = lr_tuning.paired_runs(study[variant]["runs"], study[baseline]["runs"])
            if d.mean is not None:
                deltas[i][variant] = d.mean
                resolved[i][variant] = abs(d.mean) > floor and d.agreeing == len(d.differences) > 1
            cells.append(paired_cells(d, left_out, unrecorded)[0])
        lines.append("| " + " | ".join([variant, *cells]) + " |")
    rho = spearman(*deltas)
    swaps = [f"{x} / {y}" for i, x in enumerate(variants) for y in variants[i + 1:]
             if all(v in d for d in deltas for v in (x, y))
             and (deltas[0][x] - deltas[0][y]) * (deltas[1][x] - deltas[1][y]) < 0]
    cleared = [s for s in swaps if all(resolved[i][v] for i in (0, 1) for v in s.split(" / "))]
    lines += ["", f"Rank correlation (Spearman) of the Δ vs {baseline} orderings, over the {len(deltas[0].keys() & deltas[1].keys())} "
              f"variants both studies resolve: " + ("—" if rho is None else f"{rho:+.2f}") + ".",
              f"Pairs whose order swaps: {', '.join(swaps) or 'none'}; of them, with every Δ beyond the floor "
              f"({floor:g} nats) and all seeds agreeing in both studies: {', '.join(cleared) or 'none'}."]
    return "\n".join(lines)
