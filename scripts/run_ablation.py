"""Normalization ablation: the same training job for several variants, depths and seeds, then plots and a table.

    python scripts/run_ablation.py --out_dir out/ablation --seeds 0 1 2 --max_steps 300
    python scripts/run_ablation.py --variants all --seeds 0
    python scripts/run_ablation.py --variants pre-rmsnorm post-rmsnorm deepnorm-rmsnorm --depths 8 16 32
    python scripts/run_ablation.py --learning_rates 1e-3 3e-3 1e-2 --warmup_steps 0 50   # stability grid
    python scripts/run_ablation.py --tune_lr 1e-3 2e-3 4e-3 8e-3 1.6e-2 --seeds 0 1 2     # fair study
    torchrun --nproc_per_node 8 scripts/run_ablation.py --tune_lr 1e-3 2e-3 4e-3 --seeds 0 1 2   # 8 runs at a time

Every run goes through trainer.train_pretrain.train (as `python trainer/train_pretrain.py` does), with the same
data, seeds and step budget; any trainer flag passes through. A variant is <placement>-<norm>, e.g. pre-rmsnorm,
post-layernorm, pre+qk_head-rmsnorm (PLACEMENTS in study/variants.py). Finished runs are reused when the study runs
again with the same out_dir, so an interrupted study picks up where it stopped.

--tune_lr compares every (variant, depth) at its own best peak lr: the first seed trains at each grid point, the
lowest final validation loss of a run that neither diverged nor plateaued wins (the grid grows past a winning edge),
then the other seeds train at that lr; tuning.json, lr_sensitivity.png and results.md's paired differences against
--baseline report it (docs/results/fair.md, study/lr_tuning.py). Under torchrun the ranks train whole runs side by
side (--parallel runs) or each run in turn across all ranks (--parallel data); rank 0 writes the report (docs/gpu.md).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, require_writable_dir, run_cli
from model import NORM_TYPES
from study.parallel import Worker, require_locks
from study.report import report
from study.runner import StudyInterrupted, tokenize_once, train_study
from study.settings import DEFAULT_BASELINE, MAX_SEED, study_settings
from study.variants import NAMED, PLACEMENTS

DEFAULT_VARIANTS = ["pre-rmsnorm", "pre-layernorm", "post-rmsnorm", "post-layernorm"]


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__,
                       epilog="All other flags are trainer flags (see python trainer/train_pretrain.py --help).")
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS,
                   help=f"<placement>-<norm> names, the whole names {' '.join(NAMED)}, or 'all' for every variant "
                        f"that makes a model (not, e.g., hybrid-none: HybridNorm's q, k and v norms need a norm "
                        f"type); placements: {' '.join(PLACEMENTS)}; norms: {' '.join(sorted(NORM_TYPES))}")
    p.add_argument("--seeds", nargs="+", type=int, default=[0],
                   help=f"each variant runs once per seed, in [0, {MAX_SEED}]")
    p.add_argument("--depths", nargs="+", type=int, default=None,
                   help="depth study: numbers of blocks, one run per depth (default: the trainer's "
                        "--num_hidden_layers)")
    p.add_argument("--learning_rates", nargs="+", type=float, default=None,
                   help="stability grid: peak learning rates (default: the trainer's --learning_rate)")
    p.add_argument("--warmup_steps", nargs="+", type=int, default=None,
                   help="stability grid: warmup lengths (default: the trainer's --warmup_steps)")
    p.add_argument("--tune_lr", nargs="+", type=float, default=None, metavar="LR",
                   help="fair study: peak learning rates to sweep per variant and depth with the first seed; the "
                        "other seeds train only at the lr with the lowest final validation loss (see above)")
    p.add_argument("--baseline", default=None,
                   help=f"with --tune_lr: the variant every other one is compared with, seed by seed, at the same "
                        f"depth; when given, one of --variants (default: {DEFAULT_BASELINE}, compared with when it "
                        "is one of --variants)")
    p.add_argument("--out_dir", default="out/ablation", help="study folder: runs/, plots, results.md")
    p.add_argument("--parallel", choices=("runs", "data"), default="runs",
                   help="under torchrun: runs, each rank trains whole runs of the study side by side, alone on its own "
                        "GPU (or its share of the CPU cores), each as the study without torchrun would; data, every "
                        "run in turn across all ranks with data parallelism (DDP), for a model too big for one "
                        "device. Without torchrun nothing changes (default: runs)")
    return study_settings(*p.parse_known_args(argv))


def main(argv: list[str] | None = None) -> None:
    study, base = parse_args(argv)
    worker = Worker.from_environment()
    runs_side_by_side = worker.world_size > 1 and study.parallel == "runs"
    if runs_side_by_side:
        worker.own_share(base)
        claims = Path(study.out_dir) / ".claims"
        require_writable_dir("--out_dir", Path(study.out_dir))
        require_locks(claims)
        tokenize_once(base, claims)
    try:
        plan = train_study(study, base, worker)
    except StudyInterrupted:
        print("study interrupted; run the same command again to continue where it stopped")
        return
    if runs_side_by_side and worker.rank != 0:
        return  # rank 0 writes the report, once every rank's runs are finished
    if plan.groups or plan.tuning:
        report(study, base, plan.groups, plan.tuning)


if __name__ == "__main__":
    run_cli(main)
