"""Every verdict the README and docs/results/ state, computed from the committed study folders by one rule
(study/claims.py): writes docs/results/claims.md and claims.csv, and the README's claims table.

    python scripts/write_claims.py            # after a study folder gained runs
    python scripts/write_claims.py --check    # exit 1 when the README's table is not the computed one
"""

import csv
import io
import json
import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli
from common.fs import write_atomically
from study import claims
from study.report import markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"
READING = ("Each gap's change from one rung to the next, seed by seed, by the same rule (shrinks, grows, "
           "holds, open). *budget*: both gaps shrink within one pass (400 → 760 steps); else *repetition*: "
           "from 760 to 1,600 steps the val gap shrinks, the train gap holds or grows; else *open*. "
           "([budget-readout.md](budget-readout.md))")
LR_CHECK = ("Tune seeds 0 and 1 at 1,600 steps: the 400-step lr *moves* when it failed or another lr's mean "
            "is lower by more than 0.02 nats; that variant's 1,600-step verdicts are then at an lr that is "
            "not its best there. ([budget-readout.md](budget-readout.md))")
BEGIN, END = "<!-- claims: written by scripts/write_claims.py -->", "<!-- end of claims -->"


def claims_table(rows: list[dict]) -> str:
    head = ["claim", "expects", "folder", "Δ val loss vs baseline, fresh seeds: mean [95% CI], p",
            "n (failed)", "Δ train loss", "verdict"]
    lines = []
    for previous, r in zip([None, *rows], rows, strict=False):
        first = previous is None or r["claim"] != previous["claim"]  # a claim's name on its first row only
        lines.append([r["claim"] if first else "", f"{r['variant']} {r['expected']} {r['baseline']}"
                      if first else "", r["folder"], claims.cell(r["val"]), f"{r['seeds']} ({r['failed']})",
                      claims.cell(r["train"]), f"**{r['verdict']}**"])
    return markdown_table(head, lines)


def reading_table(rows: list[dict]) -> str:
    steps = [f'{int(folder.rsplit("-", 1)[1]):,}' for folder in claims.RUNGS]
    head = ["claim", *(f"{metric} gap's change, {a} → {b} steps: mean [95% CI], p"
                       for a, b in pairwise(steps) for metric in ("val", "train")), "reading"]
    cells = [[r["claim"], *(f"{claims.cell(s)}, n {s.n} ({trend})" for change in r["changes"]
                            for s, trend in change.values()), f"**{r['reading']}**"] for r in rows]
    return markdown_table(head, cells)


def lr_table(checks: list[dict]) -> str:
    head = ["variant", "lr chosen at 400 steps", "mean final val loss over seeds 0-1 at 1,600 steps, by lr",
            "the choice"]
    return markdown_table(head, [[c["variant"], f"{c['chosen']:g}", ", ".join(
        f"{lr:g}: {'failed' if loss is None else f'{loss:.3f}'}" for lr, loss in c["means"].items()),
        f"**{c['outcome']}**"] for c in checks]) if checks else "Not run yet."


def regime_table(rows: list[dict]) -> str:
    folders = {r["folder"]: r for r in rows}
    head = ["folder", "optimizer", "steps", "tokens per parameter", "passes over the data", "width",
            "head_dim", "layers", "corpus", "CPU"]
    return markdown_table(head, [[f, r["optimizer"], str(r["steps"]), f"{r['tokens_per_param']:.2f}",
                                  "—" if r["passes"] is None else f"{r['passes']:.2f}", str(r["width"]),
                                  str(r["head_dim"]), str(r["layers"]), r["corpus"], r["cpus"]]
                                 for f, r in sorted(folders.items())])


def readme_block(rows: list[dict]) -> str:
    return "\n".join([BEGIN, "", claims.RULE, "", claims_table(rows), "", "Each folder's regime (under "
                      "docs/results/):", "",
                      regime_table(rows), "", END])


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    fields = ["claim", "expected", "variant", "baseline", "folder", "verdict", "seeds", "failed"]
    regime = ["optimizer", "steps", "tokens_per_param", "passes", "width", "head_dim", "layers", "corpus"]
    stats_fields = [(m, k) for m in ("val", "train") for k in ("mean", "ci_low", "ci_high", "p")]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(fields + [f"{m}_{k}" for m, k in stats_fields] + regime)
    for r in rows:
        stats = [getattr(r[m], k) for m, k in stats_fields]
        writer.writerow([r[f] for f in fields] + stats + [r[k] for k in regime])
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when README.md's claims "
                   "table, claims.md or claims.csv is not what the committed runs give")
    args = p.parse_args(argv)
    rows = claims.compute_all()
    readings = [claims.reading(claim) for claim in json.loads(claims.CLAIMS.read_text())
                if set(claims.RUNGS) <= set(claim["folders"])]  # the claims tested at every rung
    readme = README.read_text(encoding="utf-8")
    if BEGIN not in readme or END not in readme:
        raise UserError(f"README.md has no claims block ({BEGIN} ... {END})")
    before, rest = readme.split(BEGIN)
    page = ["# Claims, computed", "", claims.RULE, "", claims_table(rows), "", "## The folders", "",
            regime_table(rows), "", "## Budget or repetition", "", READING, "",
            reading_table(readings), "", "## The lr at 1,600 steps", "", LR_CHECK, "",
            lr_table(claims.lr_check("budget/adamw-1600-lr", "budget/adamw-400")), ""]
    files = {README: before + readme_block(rows) + rest.split(END, 1)[1],
             claims.RESULTS / "claims.md": "\n".join(page), claims.RESULTS / "claims.csv": csv_text(rows)}
    if args.check:
        stale = [str(path) for path, text in files.items()
                 if not path.is_file() or path.read_text(encoding="utf-8") != text]
        sys.exit(f"not what the runs give: {', '.join(stale)}; run python scripts/write_claims.py"
                 if stale else 0)
    for path, text in files.items():
        write_atomically(path, text)
    print(f"{len(rows)} verdicts; wrote {', '.join(str(path) for path in files)}")


if __name__ == "__main__":
    run_cli(main)
