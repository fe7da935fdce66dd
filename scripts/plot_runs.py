"""Loss curves of trainer runs side by side, e.g. two runs one flag apart:

    python scripts/plot_runs.py out/pretrain out/layernorm --out out/curves.png

Train and validation loss against step and against training time, one line per run, from each
run's metrics.jsonl (a killed or still running run draws what it logged). A study's runs are drawn
by scripts/run_ablation.py's report instead, as a mean over seeds.
"""

import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli, user_path
from study.plots import plot_loss_curves
from trainer.checkpoint import run_folder
from trainer.tracking import read_metrics


def label(run: Path, name: str) -> str:
    """name, with the run's variant where it recorded one (at its end)."""
    try:
        variant = json.loads((run / "summary.json").read_text(encoding="utf-8"))["variant"]
    except (OSError, ValueError, KeyError, TypeError):
        return name
    return f"{name} ({variant})"


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", metavar="DIR", type=user_path,
                   help="run folders (the trainer's --out_dir) or step folders in them")
    p.add_argument("--out", default="loss_curves.png", type=user_path,
                   help="where the PNG goes (default: loss_curves.png)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise UserError(f"--out {out}: the figure is a PNG; name it *.png")
    runs = [run_folder(path) for path in args.runs]
    if len(set(runs)) < len(runs):
        raise UserError("a run is given twice (a step folder is its run's)")
    names = [run.name for run in runs]
    if len(set(names)) < len(names):  # e.g. a/seed0 and b/seed0
        names = [os.path.relpath(run) for run in runs]
    curves = {}
    for run, name in zip(runs, names, strict=True):
        if not run.is_dir():  # a typo, or a file such as metrics.jsonl itself
            raise UserError(f"{run}: no such folder" if not run.exists() else
                            f"{run}: not a folder; pass a run folder, the trainer's --out_dir")
        metrics = run / "metrics.jsonl"
        if not metrics.is_file():
            raise UserError(f"{run}: no metrics.jsonl; pass a run folder, the trainer's --out_dir")
        records = read_metrics(metrics)
        if not any(math.isfinite(r.get("loss", math.nan)) for r in records):
            raise UserError(f"{run}: no finite training loss in its metrics.jsonl yet "
                            "(a run that diverged, or has not logged a step)")
        curves[label(run, name)] = [records]
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_loss_curves(curves, out, title="one line per run")
    print(f"wrote {out}")


if __name__ == "__main__":
    run_cli(main)
