"""Where a result came from: the code, the libraries, the machine and the date, recorded beside the numbers."""

import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def git(*command: str) -> str | None:
    """The output of a git command in this checkout, or None without git or outside a git checkout."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *command], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (taskset, a container's or a job scheduler's cpuset),
    which can be far fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


# The vector and matrix extensions that decide which CPU kernels torch runs (and so its speed, and the rounding
# of its matmuls): /proc/cpuinfo's flag for each, and the name recorded.
CPU_EXTENSIONS = {"avx2": "AVX2", "avx512f": "AVX-512", "amx_tile": "AMX"}


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """The CPU's model as the kernel names it (e.g. 'AMD EPYC 7B13'), else as the platform module does, and
    which CPU_EXTENSIONS the kernel's flags list (None where there is no cpuinfo: not Linux)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return {"cpu": platform.processor() or platform.machine(), "cpu_isa": None}
    info = {}  # the first processor's entry (a hybrid CPU's cores can list different flags: the first is recorded)
    for key, _, value in (line.partition(":") for line in lines):
        info.setdefault(key.strip(), value.strip())
    flags = set(info.get("flags", "").split())
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
            "cpu_isa": [name for flag, name in CPU_EXTENSIONS.items() if flag in flags]}


def environment(device: torch.device | str | None = None) -> dict:
    """The commit and whether tracked files differ from it (None outside a git checkout), the libraries'
    versions, the device (the GPU, or the CPU), the CPU (on a GPU run too: the host feeds it), torch's
    threads, the UTC date."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    commit = git("rev-parse", "HEAD")
    # the results folder aside: a study writes its runs and report there while it trains
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/results")
    host = cpu()
    return {
        "git_commit": commit,
        "git_dirty": None if commit is None or dirty is None else bool(dirty),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "datasets": version("datasets"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else host["cpu"],
        **host,
        "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def describe(env: dict) -> str:
    """One line for the top of a results page."""
    commit = f"{env['git_commit'][:12]}{' (dirty)' if env['git_dirty'] else ''}" if env["git_commit"] else "unknown"
    return (f"Produced {env['date']} by commit {commit}, torch {env['torch']}, transformers {env['transformers']}, "
            f"datasets {env['datasets']}, on {env['device']} ({env['threads']} threads).")
