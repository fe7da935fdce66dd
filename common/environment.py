"""Where a result came from:
the code, the libraries, the machine and the date, recorded with it."""

import contextlib
import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def git(*command: str) -> str | None:
    """The output of a git command in this checkout,
    or None without git or outside a checkout."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *command],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def usable_cores() -> int:
    """The cores this process may use (taskset, a container's cpuset):
    maybe far fewer than all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model as the kernel names it ('AMD EPYC 7B13');
    the platform's name elsewhere."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device | str | None = None) -> dict:
    """The commit and whether the files differ from it (None outside a git checkout),
    the libraries' versions, the device, the CPU (on a GPU run too),
    torch's threads, the UTC date."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    commit = git("rev-parse", "HEAD")
    # untracked files count too, but not docs/results:
    # a study writes there while it trains
    dirty = git("status", "--porcelain", "--", ".", ":(exclude)docs/results")
    host = cpu_model()
    return {
        "git_commit": commit,
        "git_dirty": None if commit is None or dirty is None else bool(dirty),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": metadata.version("transformers"),
        "datasets": metadata.version("datasets"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else host,
        "cpu": host,
        # the kernels torch runs (AVX2, AVX512, ...; ATEN_CPU_CAPABILITY lowers it):
        # they decide how float32 matmuls round, so runs compare only within one
        "cpu_isa": [torch.backends.cpu.get_cpu_capability()],
        "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def describe(env: dict) -> str:
    """One line for the top of a results page."""
    commit = (env["git_commit"][:12] + " (dirty)" * bool(env["git_dirty"])
              if env["git_commit"] else "unknown")
    return (f"Produced {env['date']} by commit {commit}, torch {env['torch']}, "
            f"transformers {env['transformers']}, datasets {env['datasets']}, "
            f"on {env['device']} ({env['threads']} threads).")
