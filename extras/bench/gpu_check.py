"""The GPU checks in one command, on a machine with a CUDA GPU, and their numbers printed.

    python extras/bench/gpu_check.py [--budget 480]

Runs tests/test_cuda.py, then bench_train.py (bf16, eager and compiled, at the CUDA preset's batch) and
bench_norms.py (fp32, bf16 and fp16 at that batch's tokens), each as its own process with its own time limit,
within --budget seconds in all (a step that no longer fits is skipped). After each step it prints the step's
status and the end of what it printed: pytest's summary, the benchmark's table. Exit status 1 when a step
failed or timed out; without a usable CUDA GPU, one line and exit status 2. docs/gpu.md has the steps.
"""

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch

from common.cli import ArgumentParser, UserError, non_negative, run_cli
from trainer.args import DEVICE_DEFAULTS, build_parser

# the shape the default GPU run trains at: the CUDA preset's batch, --max_seq_len's default
BATCH, SEQ = DEVICE_DEFAULTS["cuda"]["batch_size"], build_parser().get_default("max_seq_len")


def steps() -> list[tuple[str, list[str], float]]:
    """(name, command, the seconds it may take at most), in the order they run."""
    py = sys.executable
    return [
        ("tests/test_cuda.py", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
         150),
        ("bench_train", [py, "extras/bench/bench_train.py", "--device", "cuda", "--dtype", "bfloat16",
                         "--batch_size", str(BATCH), "--seq_len", str(SEQ), "--steps", "5", "--rounds", "3"],
         200),
        ("bench_norms", [py, "extras/bench/bench_norms.py", "--device", "cuda", "--dtypes", "fp32", "bf16",
                         "fp16", "--tokens", str(BATCH * SEQ), "--iters", "200"], 90),
    ]


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--budget", type=non_negative, default=480,
                   help="seconds for all the steps together (one 10-minute call, with time left to install "
                        "the wheels); a step is skipped once less than 30 s (or its own limit) is left")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise UserError(f"no usable CUDA GPU here (torch {torch.__version__}, built for CUDA "
                        f"{torch.version.cuda or 'none'}); gpu_check.py measures the GPU path and needs one")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
          flush=True)
    deadline, failed = time.monotonic() + args.budget, False
    for name, command, limit in steps():
        left = deadline - time.monotonic()
        if left < min(limit, 30):
            print(f"== {name}: skipped ({left:.0f} s of --budget left)", flush=True)
            continue
        limit = min(limit, left)
        start = time.monotonic()
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=limit)
            status = f"exit {done.returncode}" if done.returncode else "ok"
            out, err = done.stdout, done.stderr
        except subprocess.TimeoutExpired as timeout:  # what it printed until then comes as bytes
            status = f"timed out after {limit:.0f} s"
            out, err = (t.decode() if isinstance(t, bytes) else t or ""
                        for t in (timeout.stdout, timeout.stderr))
        failed |= status != "ok"
        tail = out.strip().splitlines()[-30:] + (err.strip().splitlines()[-15:] if status != "ok" else [])
        print(f"== {name}: {status} in {time.monotonic() - start:.0f} s", *tail, sep="\n", flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main)
