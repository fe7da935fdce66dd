"""Wall time of one ablation study trained run after run, against the same study under torchrun with the runs side by
side (--parallel runs), on this machine, and whether every run's summary came out the same.

    python scripts/bench_parallel_study.py                               # 2 variants x 2 seeds, one rank per core
    python scripts/bench_parallel_study.py --ranks 2 --max_steps 200

Both studies get the same threads in all: each rank gets what the runner gives it (the usable cores divided by the
ranks), the study without torchrun that many times the ranks. Each starts from the same tokenized corpus, so neither
pays for tokenizing. Any other flag is a runner or trainer flag.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, UserError, run_cli
from common.environment import describe, environment, usable_cores

REPO = Path(__file__).resolve().parents[1]
RUNNER = str(REPO / "scripts" / "run_ablation.py")
COMPARED = ("step", "train_loss", "val_loss", "val_bpb")


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"{' '.join(command[:4])} ... failed: {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    return time.perf_counter() - start


def summaries(study: Path) -> dict[str, dict]:
    return {Path(r["out_dir"]).name: {k: r[k] for k in COMPARED}
            for r in json.loads((study / "results.json").read_text())}


def main(argv=None) -> None:
    p = ArgumentParser(description=__doc__, epilog="Other flags pass through to scripts/run_ablation.py.")
    p.add_argument("--ranks", type=int, default=usable_cores(),
                   help="torchrun --nproc_per_node (default: the usable cores)")
    p.add_argument("--variants", nargs="+", default=["pre-rmsnorm", "post-rmsnorm"], help="the study's variants")
    p.add_argument("--seeds", nargs="+", default=["0", "1"], help="the study's seeds")
    p.add_argument("--max_steps", default="60", help="steps per run")
    args, rest = p.parse_known_args(argv)
    if args.ranks < 2:
        raise UserError(f"--ranks must be at least 2 to compare anything, got {args.ranks}")
    per_rank = max(1, usable_cores() // args.ranks)
    study = ["--variants", *args.variants, "--seeds", *args.seeds, "--max_steps", args.max_steps, *rest]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MINIMIND_CACHE": str(Path(tmp) / "cache"), "WANDB_MODE": "disabled"}
        warm = ["--out_dir", str(Path(tmp) / "warm"), "--variants", args.variants[0], "--seeds", args.seeds[0],
                "--max_steps", "1", *rest]
        timed([sys.executable, RUNNER, *warm], env)  # tokenizes into the shared cache
        alone = timed([sys.executable, RUNNER, "--out_dir", str(Path(tmp) / "alone"), *study],
                      {**env, "OMP_NUM_THREADS": str(per_rank * args.ranks)})
        side_by_side = timed([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={args.ranks}", RUNNER, "--out_dir", str(Path(tmp) / "ranks"), *study],
                             {**env, "OMP_NUM_THREADS": "1"})
        first, second = summaries(Path(tmp) / "alone"), summaries(Path(tmp) / "ranks")
    if first.keys() != second.keys() or any(first[r]["step"] != second[r]["step"] for r in first):
        raise UserError("the two studies did not train the same runs to the same step")
    gap = max(abs(first[r][k] - second[r][k]) for r in first for k in COMPARED if isinstance(first[r][k], float))
    print(describe(environment()) + f" {usable_cores()} usable cores.")
    print(f"{len(first)} runs, {args.max_steps} steps each: one after another with {per_rank * args.ranks} threads "
          f"{alone:.1f} s; side by side under torchrun, {args.ranks} ranks of {per_rank} thread(s), {side_by_side:.1f} s: "
          f"{side_by_side / alone:.2f}x the wall time; summaries " +
          ("identical" if gap == 0 else f"differ by at most {gap:.1e} (losses and bits per byte: a run's "
           f"arithmetic with {per_rank * args.ranks} threads rounds differently from one with {per_rank})"))


if __name__ == "__main__":
    run_cli(main)
