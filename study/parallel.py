"""A study's runs side by side under torchrun: each rank trains whole runs, alone on its own device and exactly as
without torchrun, taking the next one no other rank holds. Ranks share nothing but the study folder: a rank claims a
run by an flock on a file (the kernel drops it however its holder ends, so a killed rank frees its run) and decides
under it whether the run is finished, to resume or to start. What can train next is worked out anew from the
finished runs' summaries, so every rank makes the same choices and a late rank picks up where the others are."""

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from common.cli import UserError
from common.environment import usable_cores
from common.fs import LockHeld, exclusive_lock
from trainer.device import pick_device

# How often an idle rank looks again for a run it can take (every one that can train now is held by another rank).
POLL_S = 1.0
# torchrun's variables, hidden from the trainer so that each run is a single-process run.
TORCHRUN_VARIABLES = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}


@dataclass(frozen=True)
class Worker:
    """This process's place among the study's processes: torchrun's ranks, or the one process of a plain run."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @classmethod
    def from_environment(cls) -> "Worker":
        env = os.environ
        world_size = int(env.get("WORLD_SIZE", "1"))
        return cls(int(env.get("RANK", "0")), world_size, int(env.get("LOCAL_RANK", "0")),
                   int(env.get("LOCAL_WORLD_SIZE", str(world_size))))

    def own_share(self, base) -> None:
        """Make every run this process trains a single-process run on its share of the machine: its own GPU
        (cuda:LOCAL_RANK), or its share of the usable CPU cores as torch threads."""
        if pick_device(base.device).type == "cuda":
            if self.local_world_size > torch.cuda.device_count():
                raise UserError(f"{self.local_world_size} ranks on this node but {torch.cuda.device_count()} GPUs: "
                                "start torchrun with --nproc_per_node at most the number of GPUs")
            # the device --device cuda (or auto) means; the flag stays as given, so any rank can reuse any run
            torch.cuda.set_device(self.local_rank)
        else:
            torch.set_num_threads(max(1, usable_cores() // self.local_world_size))
        os.environ.update(TORCHRUN_VARIABLES)  # else the trainer would join the ranks' runs into one DDP job


def require_locks(folder: Path) -> None:
    """Claims are flocks: on a filesystem without them (some network filesystems) two ranks could train one run."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive_lock(folder / "probe.lock") as locked:
            pass
    except LockHeld:  # another rank probing at the same moment: locks work
        return
    if not locked:
        raise UserError(f"{folder} is on a filesystem without file locks, so the ranks cannot share out the runs "
                        "safely: put --out_dir on a local filesystem (one per node), or use --parallel data")


def try_claim(path: Path) -> ExitStack | None:
    """The claim on one run (hold it with `with`), or None when another process holds it."""
    claim = ExitStack()
    try:
        claim.enter_context(exclusive_lock(path))
    except LockHeld:
        return None
    return claim


@contextmanager
def waiting_claim(path: Path, timeout_min: float, what: str) -> Iterator[None]:
    """Hold the claim on `path`, waiting while another process holds it, at most timeout_min minutes."""
    deadline = time.monotonic() + timeout_min * 60
    while (claim := try_claim(path)) is None:
        if time.monotonic() > deadline:
            raise UserError(f"waited {timeout_min:g} minutes (--dist_timeout) for another rank {what} ({path}); "
                            "it hangs or is slow: raise --dist_timeout, or find what holds it up")
        time.sleep(POLL_S)
    with claim:
        yield


def last_change(folders: list[Path]) -> float:
    """When anything in these run folders last changed (a run logs, evaluates and saves as it goes). The training
    rank renames and deletes files meanwhile: what is gone by the time it is looked at is skipped."""
    times = []
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                times += [folder.stat().st_mtime, *(entry.stat(follow_symlinks=False).st_mtime for entry in entries)]
        except FileNotFoundError:
            continue
    return max(times, default=0.0)


def train_in_parallel(pending: Callable[[], list], claim_path: Callable, run_folder: Callable, train: Callable,
                      timeout_min: float, wait: bool = True) -> None:
    """Train, one at a time, the runs pending() lists (in the study's order, from the finished runs' summaries) that no
    other rank holds, until none is left. With nothing to take, return, or with wait, wait for the other ranks' runs
    (which may let new ones train); give up when none of them changes for timeout_min minutes: a rank hangs."""
    quiet_since, seen = time.monotonic(), 0.0
    while runs := pending():
        for run in runs:
            claim = try_claim(claim_path(run))
            if claim is not None:
                with claim:
                    train(run)
                quiet_since = time.monotonic()
                break
        else:  # every run that can train now is training on another rank
            if not wait:
                return
            changed = last_change([run_folder(run) for run in runs])
            if changed != seen:
                seen, quiet_since = changed, time.monotonic()
            elif time.monotonic() - quiet_since > timeout_min * 60:
                raise UserError(f"the runs other ranks hold ({len(runs)}) have not changed for {timeout_min:g} minutes "
                                "(--dist_timeout): a rank hangs; stop the study and run the same command again, or "
                                "raise --dist_timeout")
            time.sleep(POLL_S)
