"""Loss curves of trainer runs side by side, e.g. two runs one flag apart:

    python scripts/plot_runs.py out/pretrain out/post-ln --out out/curves.png

Train and validation loss against step and against training time, one line per run, from each
run's metrics.jsonl (a killed or still running run draws what it logged). A study's runs are drawn
by scripts/run_ablation.py's report instead, as a mean over seeds.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli
from study.plots import plot_loss_curves
from trainer.checkpoint import run_folder
from trainer.tracking import read_metrics


def label(run: Path) -> str:
    """The run folder's name, with its variant where the run recorded one (at its end)."""
    try:
        variant = json.loads((run / "summary.json").read_text(encoding="utf-8"))["variant"]
    except (OSError, ValueError, KeyError, TypeError):
        return run.name
    return f"{run.name} ({variant})"


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", metavar="DIR",
                   help="run folders (the trainer's --out_dir) or step folders in them")
    p.add_argument("--out", default="loss_curves.png",
                   help="where the figure goes (default: loss_curves.png)")
    args = p.parse_args(argv)
    runs = [run_folder(path) for path in args.runs]
    labels = [label(run) for run in runs]
    if len(set(labels)) < len(labels):  # e.g. a/seed0 and b/seed0
        labels = [str(run) for run in runs]
    curves = {}
    for run, name in zip(runs, labels, strict=True):
        metrics = run / "metrics.jsonl"
        records = read_metrics(metrics) if metrics.is_file() else []
        if not records:
            raise UserError(f"{run}: no training records (metrics.jsonl); "
                            "pass a run folder, the trainer's --out_dir")
        curves[name] = [records]
    plot_loss_curves(curves, Path(args.out), title="one line per run")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_cli(main)
