"""A run directory belongs to one run.

A fresh run refuses a directory that holds another run's checkpoints or metrics (--overwrite discards them on
purpose), and the trainer holds an exclusive lock on out_dir/.lock for the whole run, so a second trainer on the
same directory refuses at once. The lock is the kernel's (flock): it goes away with its process however that
ends, so a crash never leaves a stale lock. Whatever a killed save left behind is removed under the lock.
"""

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.cli import UserError
from common.fs import LockHeld, exclusive_lock, remove_leftovers
from model.model_minimind import QKV_PLACEMENTS
from trainer.checkpoint import LINK, find_checkpoints

LOCK_FILE = ".lock"
RECORDS = ("metrics.jsonl", "summary.json", "layers.png", "wandb")  # a run's files besides its checkpoints
FILES = (LOCK_FILE, "metrics.jsonl", "summary.json", "layers.png")  # those the trainer writes as plain files


def previous_run(out_dir: Path) -> list[str]:
    """What in out_dir belongs to an earlier run: its checkpoints, metrics or summary."""
    found = [p.name for p in find_checkpoints(out_dir)]
    metrics = out_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(metrics.name)
    if (out_dir / "summary.json").is_file():
        found.append("summary.json")
    return found


def no_checkpoint(out_dir: Path, records: list[str]) -> str:
    """What to run in an out_dir that holds a run's records but no checkpoint (it was stopped or killed before
    its first save completed): there is nothing to resume, so the way on is to start over."""
    return (f"--out_dir {out_dir} holds the records of a run that saved no checkpoint ({', '.join(records)}), so "
            "there is nothing to resume: pass --overwrite to discard them and start afresh, or choose a new --out_dir")


def discard_run(out_dir: Path) -> None:
    """--overwrite: delete the earlier run's checkpoints and records, and nothing else in the directory."""
    for path in [out_dir / LINK, *out_dir.glob("step-*"), *(out_dir / name for name in RECORDS)]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()


def only_a_lock(out_dir: Path) -> bool:
    return out_dir.is_dir() and [p.name for p in out_dir.iterdir()] == [LOCK_FILE]


@contextmanager
def claim_run_dir(out_dir: Path, resume: bool, overwrite: bool) -> Iterator[None]:
    """Own out_dir for the block: create it, lock it, and refuse another run's directory unless resuming it or
    told to overwrite it. A directory this call created is removed again if the run leaves nothing in it; so is
    one that held only a lock file (what a trainer killed before its first write leaves: it could not clean up)."""
    created = not out_dir.exists() or only_a_lock(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in FILES:  # (something else put there: the trainer would fail on it only when it first writes it)
        if (out_dir / name).is_dir():
            raise UserError(f"{out_dir / name} is a directory, where the trainer keeps its {name} file; move it "
                            "away, or choose another --out_dir")
    lock = out_dir / LOCK_FILE
    try:
        with exclusive_lock(lock) as locked:
            if not locked:
                print(f"warning: cannot lock {lock} (the filesystem has no locks); make sure no other trainer "
                      "uses this --out_dir", file=sys.stderr)
            found = previous_run(out_dir)
            if found and not resume and not overwrite:
                if not find_checkpoints(out_dir):
                    raise UserError(no_checkpoint(out_dir, found))
                raise UserError(f"--out_dir {out_dir} holds another run ({', '.join(found)}); continue it with "
                                "--resume, choose a new --out_dir, or pass --overwrite to discard it")
            leftovers = remove_leftovers(out_dir)
            if leftovers:
                print(f"removed what crashed saves left in {out_dir}: {', '.join(leftovers)}", file=sys.stderr)
            try:
                yield
            finally:
                if created and only_a_lock(out_dir):
                    lock.unlink()
                    out_dir.rmdir()
    except LockHeld as held:
        holder = f" (pid {held})" if str(held) else ""
        raise UserError(f"--out_dir {out_dir} is in use by another trainer{holder}; wait for it to finish or "
                        "choose another --out_dir") from None


# --- compatibility with runs recorded by older versions of the trainer ----------------------------------

# Flags whose default depends on others, and the value a run recorded before the flag existed had in effect.
RECORDED_BEFORE = {"diag_interval": lambda saved: saved.get("log_interval"),
                   # HybridNorm's q, k and v norms were set explicitly; every other placement had none
                   **dict.fromkeys(("qk_norm", "v_norm"), lambda saved: "head" if saved.get("norm_position")
                                   in QKV_PLACEMENTS else "none")}


def recorded_value(saved: dict, flag: str):
    """The value of `flag` a recorded run (the args in its summary or checkpoint) was trained with. A flag added
    after the run was recorded is missing from its args; new flags default to the old behaviour, so the run had
    the parser default (or, for a flag in RECORDED_BEFORE, the value derived from the run's other flags)."""
    from trainer.args import build_parser  # here, not above: trainer.args imports this module

    if flag in saved:
        return saved[flag]
    if flag in RECORDED_BEFORE:
        return RECORDED_BEFORE[flag](saved)
    return build_parser().get_default(flag)
