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


def cpu_name() -> str:
    """The CPU model as the kernel names it (e.g. 'AMD EPYC 7B13'), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The vector and matrix extensions that decide which CPU kernels torch runs (and so its speed, and the rounding
# of its matmuls): /proc/cpuinfo's flag for each, and the name recorded.
CPU_EXTENSIONS = {"avx2": "AVX2", "avx512f": "AVX-512", "amx_tile": "AMX"}


def cpu_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str] | None:
    """Which of AVX2, AVX-512 and AMX this CPU has, from the kernel's flags in cpuinfo (an empty list for none of
    them); None where the kernel does not say (not Linux)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return None
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return [name for flag, name in CPU_EXTENSIONS.items() if flag in flags]


def environment(device: torch.device | str | None = None) -> dict:
    """The commit (None outside a git checkout) and whether tracked files differed from it, the versions of the
    libraries that compute the numbers, the device's name (the GPU's for a CUDA device, else the CPU's), the CPU's
    model and instruction-set extensions (on a GPU run too: the host feeds it), torch's thread count and the date
    (UTC)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": commit,
        "git_dirty": None if commit is None or dirty is None else bool(dirty),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "datasets": version("datasets"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "cpu": cpu_name(),
        "cpu_isa": cpu_isa(),
        "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def describe(env: dict) -> str:
    """One line for the top of a results page."""
    commit = f"{env['git_commit'][:12]}{' (dirty)' if env['git_dirty'] else ''}" if env["git_commit"] else "unknown"
    return (f"Produced {env['date']} by commit {commit}, torch {env['torch']}, transformers {env['transformers']}, "
            f"datasets {env['datasets']}, on {env['device']} ({env['threads']} threads).")
