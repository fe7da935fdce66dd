"""Compare two fair studies of the same variants, e.g. under Muon and under AdamW (study/compare.py says how).

    python scripts/compare_studies.py docs/results/muon/muon docs/results/muon/adamw --labels Muon AdamW

Each folder is one scripts/run_ablation.py --tune_lr wrote (tuning.json, results.json); prints the table in markdown.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli
from study.compare import compare

# A same-seed rerun on another CPU type ends this far from the recorded loss (docs/results/muon.md): a smaller
# difference may be the machine's rounding rather than the variant.
DEFAULT_FLOOR = 0.011


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
