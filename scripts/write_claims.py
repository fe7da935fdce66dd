"""Every verdict the README and docs/results/ state, computed from the committed study folders by one
rule (study/claims.py): writes docs/results/claims.md, claims.csv and the forest plot claims.png, the
README's claims table, and the seeds each claim's primary test needs into the epochs read-out.

    python scripts/write_claims.py            # after a study folder gained runs
    python scripts/write_claims.py --check    # exit 1 when a written table is not the computed one
"""

import csv
import io
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli
from common.fs import write_atomically
from study import claims
from study.plots import plot_forest
from study.report import markdown_table
from trainer.diagnostics import flops_per_token

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
READOUT = claims.RESULTS / "epochs-readout.md"
BEGIN, END = "<!-- claims: written by scripts/write_claims.py -->", "<!-- end of claims -->"
POWER_BEGIN, POWER_END = "<!-- power: written by scripts/write_claims.py -->", "<!-- end of power -->"
LR_CHECK = ("Tune seeds 0 and 1 at 1,600 steps: the 400-step lr *moves* when it failed or another lr's "
            "mean is lower by more than 0.02 nats; that variant's 1,600-step differences are then at "
            "an lr that is not its best there.")
# The budget folders' notes: their runs drew random windows (an epoch there is nominal), and their
# lr was chosen at 400 steps, which the lr check tests at 1,600
LR_FROM_400 = ("budget/adamw-760", "budget/adamw-1600")


def verdict_cell(row: dict) -> str:
    if row.get("not_run"):
        return "lr not chosen yet" if row.get("tuning") else "not run yet"
    if row["verdict"] == "interim":
        return f"interim ({row['seeds']} of {row['planned']} seeds)"
    return "—" if row["verdict"] is None else f"**{row['verdict']}**"


def p_holm(row: dict) -> str:
    return "—" if row["p_holm"] is None else claims.p_text(row["p_holm"])


def claims_table(rows: list[dict], primary_only: bool = False) -> str:
    head = ["claim", "expects", "folder", f"Δ val loss, fresh seeds: mean [{claims.CONFIDENCE:.0%} CI], p",
            "p, Holm", "n (failed)", "Δ train loss", "verdict"]
    lines = []
    previous = None
    for r in rows:
        if primary_only and not r["primary"]:
            continue
        first = previous is None or r["claim"] != previous["claim"]  # a claim's name on its first row
        previous = r
        folder = f"**{r['folder']}**" if r["primary"] else r["folder"]
        expects = f"{r['variant']} {r['expected']} {r['baseline']}"
        if "baseline_folder" in r:
            expects += f" of {r['baseline_folder']}"
        lines.append([r["claim"] if first else "", expects if first else "", folder,
                      claims.cell(r["val"]), p_holm(r), f"{r['seeds']} ({r['failed']})",
                      claims.cell(r["train"]), verdict_cell(r)])
    return markdown_table(head, lines)


def lr_table(checks: list[dict]) -> str:
    head = ["variant", "lr chosen at 400 steps",
            "mean final val loss over seeds 0-1 at 1,600 steps, by lr", "the choice"]
    if not checks:
        return "Not run yet."
    cells = []
    for c in checks:
        by_lr = ", ".join(f"{lr:g}: {'failed' if loss is None else f'{loss:.3f}'}"
                          for lr, loss in c["means"].items())
        cells.append([c["variant"], f"{c['chosen']:g}", by_lr, f"**{c['outcome']}**"])
    return markdown_table(head, cells)


def folder_notes(checks: list[dict]) -> dict[str, str]:
    """What a reader must know of a folder beside its regime: the lr check's outcome, where the
    baseline's lr was chosen for another budget."""
    moved = [f"{c['variant']} {c['outcome']}" for c in checks if c["outcome"] != "holds"]
    if not moved:
        return {}
    note = f"lr chosen at 400 steps; the lr check at 1,600: {', '.join(moved)}"
    return dict.fromkeys(LR_FROM_400, note)


def regime_table(rows: list[dict], notes: dict[str, str]) -> str:
    folders = {r["folder"]: r for r in rows if "change" not in r and not r.get("not_run")}
    head = ["folder", "optimizer", "steps", "tokens per parameter", "epochs", "batch order", "width",
            "head_dim", "layers", "corpus", "CPU", "note"]
    cells = []
    for f, r in sorted(folders.items()):
        nominal = r["order"] == claims.RANDOM_WINDOWS
        epochs = "—" if r["passes"] is None else f"{r['passes']:.2f}" + (" (nominal)" if nominal else "")
        per_param = "—" if r["tokens_per_param"] is None else f"{r['tokens_per_param']:.2f}"
        cells.append([f, r["optimizer"], str(r["steps"]), per_param, epochs, r["order"], str(r["width"]),
                      str(r["head_dim"]), str(r["layers"]), r["corpus"], r["cpus"], notes.get(f, "")])
    return markdown_table(head, cells)


def readme_block(rows: list[dict]) -> str:
    return "\n".join([
        BEGIN, "", claims.RULE, "", claims_table(rows, primary_only=True), "",
        "Every folder's row, each folder's regime and the figure: "
        "[docs/results/claims.md](docs/results/claims.md).", "",
        "![every claim's Δ with its CI](docs/results/claims.png)", "", END])


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    fields = ["claim", "expected", "variant", "baseline", "folder", "primary", "verdict", "seeds", "failed",
              "p_holm"]
    regime = ["optimizer", "steps", "tokens_per_param", "passes", "order", "width", "head_dim", "layers",
              "corpus"]
    stats_fields = [(m, k) for m in ("val", "train")
                    for k in ("mean", "sd", "df", "ci_low", "ci_high", "p", "p_close")]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(fields + [f"{m}_{k}" for m, k in stats_fields] + regime)
    for r in rows:
        stats = [getattr(r[m], k) for m, k in stats_fields]
        writer.writerow([r[f] for f in fields] + stats + [r.get(k) for k in regime])
    return out.getvalue()


def pilot_stats(claim: dict, source: str) -> claims.Stats:
    """A pilot source's paired statistics: 'folder' (the claim's variant there) or 'folder:variant'
    (another variant, against the same baseline), on the fresh seeds of that folder."""
    folder, _, variant = source.partition(":")
    pilot = {key: value for key, value in claim.items() if key != "baseline_folder"}
    row = claims.compute({**pilot, "variant": variant or claim["variant"], "primary": None}, folder)
    if row is None:
        raise UserError(f"the pilot {source} of {claim['claim']!r} holds no runs")
    return row["val"]


def power_rows(all_claims: list[dict], minutes: dict[int, float]) -> list[list[str]]:
    """Each claim with a pilot: the paired SD pooled over its pilot folders (weighted by df), the
    pilot's Δ, and the fresh seeds RULE needs for 80% power (claims.seeds_needed), with their cost."""
    tests = sum("primary" in c or "change" in c for c in all_claims)  # Holm's family, at its largest
    cells = []
    for claim in all_claims:
        if "pilot" not in claim:
            continue
        sds = [pilot_stats(claim, s) for s in claim["pilot"]["sd"]]
        sd = (sum(s.df * s.sd**2 for s in sds) / sum(s.df for s in sds)) ** 0.5
        effects = [pilot_stats(claim, s) for s in claim["pilot"]["effect"]]
        effect = statistics.mean(s.mean for s in effects) if effects else 0.0
        n = claims.seeds_needed(sd, effect, claim["expected"], tests)
        depth = int(claim["primary"].rsplit("L", 1)[1].split("-")[0])
        cost = n * minutes[depth] / 60  # hours for one side's fresh seeds
        cells.append([claim["claim"], claim["primary"], claim["expected"], f"{sd:.4f}",
                      f"{', '.join(claim['pilot']['sd'])}", f"{effect:+.4f}", str(n),
                      f"{n} × {minutes[depth]:.0f} min = {cost:.1f} h"])
    return cells


def minutes_per_run() -> dict[int, float]:
    """Minutes one 760-step run trains on this study's CPU, by depth: the median of the committed
    760-step folder's runs at 8 layers, scaled by the model's training FLOPs per token for 24."""
    runs = [json.loads(p.read_text())
            for p in sorted((claims.RESULTS / "budget" / "adamw-760").glob("runs/*/summary.json"))]
    at_8 = statistics.median(r["train_time_s"] for r in runs) / 60
    params = runs[0]["num_params"]
    embedding = 6400 * 128 + 128  # the tied embedding and the final norm: the same at every depth
    per_block = (params - embedding) / 8
    flops = {depth: flops_per_token(embedding + depth * per_block, depth, 128, 256) for depth in (8, 24)}
    return {depth: at_8 * flops[depth] / flops[8] for depth in (8, 24)}


def power_block(all_claims: list[dict]) -> str:
    minutes = minutes_per_run()
    head = ["claim", "primary folder", "expects", "paired SD", "SD from", "pilot Δ", "fresh seeds",
            "one side's fresh seeds"]
    per_run = ", ".join(f"{d} layers: {m:.0f} min" for d, m in minutes.items())
    return "\n".join([POWER_BEGIN, "", markdown_table(head, power_rows(all_claims, minutes)), "",
                      f"Minutes per 760-step run, one thread, on the CPU of budget/adamw-760: {per_run}.",
                      "", POWER_END])


def replace_block(text: str, begin: str, end: str, block: str, path: Path) -> str:
    if begin not in text or end not in text:
        raise UserError(f"{path} has no block to write ({begin} ... {end})")
    before, rest = text.split(begin)
    return before + block + rest.split(end, 1)[1]


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when README.md's claims "
                   "table, claims.md, claims.csv or the read-out's power table is not what the "
                   "committed runs give")
    args = p.parse_args(argv)
    all_claims = json.loads(claims.CLAIMS.read_text())
    try:
        rows = claims.compute_all(claims=all_claims)
        checks = claims.lr_check("budget/adamw-1600-lr", "budget/adamw-400")
        power = power_block(all_claims)
    except ValueError as err:  # a damaged or unfinished run in a study folder, named
        raise UserError(str(err)) from None
    page = ["# Claims, computed", "", claims.RULE, "", "![every claim's Δ with its CI](claims.png)", "",
            claims_table(rows), "", "## The folders", "", regime_table(rows, folder_notes(checks)), "",
            "## The lr at 1,600 steps", "", LR_CHECK, "", lr_table(checks), ""]
    readme = README.read_text(encoding="utf-8")
    readout = READOUT.read_text(encoding="utf-8")
    files = {README: replace_block(readme, BEGIN, END, readme_block(rows), README),
             READOUT: replace_block(readout, POWER_BEGIN, POWER_END, power, READOUT),
             claims.RESULTS / "claims.md": "\n".join(page),
             claims.RESULTS / "claims.csv": csv_text(rows)}
    if args.check:
        stale = [str(path) for path, text in files.items()
                 if not path.is_file() or path.read_text(encoding="utf-8") != text]
        sys.exit(f"not what the runs give: {', '.join(stale)}; run python scripts/write_claims.py"
                 if stale else 0)
    for path, text in files.items():
        write_atomically(path, text)
    plot_forest(rows, claims.RESULTS / "claims.png")
    print(f"{sum(r['verdict'] not in (None, 'interim') for r in rows)} verdicts; wrote "
          f"{', '.join(str(path) for path in [*files, claims.RESULTS / 'claims.png'])}")


if __name__ == "__main__":
    run_cli(main)
