"""A run folder (the trainer's --out_dir) as files: claiming it, writing a step, loading the newest
step that loads, keeping the newest k. What a step holds and what --resume checks are the trainer's.

    out/pretrain/.lock              held by the trainer writing here (an flock: the kernel drops it
                                    at exit); it marks the folder as a run of this trainer
    out/pretrain/step-000400/       one checkpoint, whatever the trainer writes into it
    out/pretrain/metrics.jsonl      every logged record; summary.json and layers.png at the end

A step folder is written under a temporary name, flushed to disk and renamed into place, so one that
exists is complete; older steps are pruned only after that. The newest that loads is the checkpoint
(found by name, as in torchtitan).
"""

import errno
import fcntl
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from common.cli import UserError, first_line
from common.fs import remove, replaced

STEP_FOLDER = re.compile(r"step-(\d+)")
# What a run writes beside its steps; --overwrite deletes these and the step folders, nothing else.
RUN_FILES = ("metrics.jsonl", "summary.json", "layers.png", "wandb")


def step_of(folder: Path) -> int:
    return int(STEP_FOLDER.fullmatch(folder.name)[1])


def step_folders(out_dir: Path) -> list[Path]:
    """The step-N folders of a run folder, newest first."""
    found = [p for p in Path(out_dir).glob("step-*") if STEP_FOLDER.fullmatch(p.name)]
    return sorted(found, key=step_of, reverse=True)


def claim(out_dir: Path, resume: bool, overwrite: bool) -> int:
    """Take out_dir for this run; return the descriptor that holds it (while it is open). Refused in
    one line: a folder another trainer holds, a fresh run's used folder without --overwrite, and
    an --overwrite of a folder that is no run of this trainer (it has no .lock)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ours = (out_dir / ".lock").exists()
    fd = os.open(out_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"--out_dir {out_dir} is in use by another trainer; wait for it, or choose "
                        "another") from None
    if problem := fresh_run_problem(out_dir, resume, overwrite, ours):
        if not ours:
            (out_dir / ".lock").unlink()  # a folder that is not a run's is left as it was
        os.close(fd)  # (a refused run in a process that trains again must not hold it)
        raise UserError(problem)
    if not resume:
        for path in [*step_folders(out_dir), *(out_dir / name for name in RUN_FILES)]:
            remove(path)
    return fd


def fresh_run_problem(out_dir: Path, resume: bool, overwrite: bool, ours: bool) -> str | None:
    if resume:
        return None if step_folders(out_dir) else (
            f"--resume: no checkpoint in {out_dir}; run without --resume to start afresh")
    used = any(p.name != ".lock" for p in out_dir.iterdir())
    if used and not overwrite:
        return (f"--out_dir {out_dir} is not empty (an earlier run?); continue it with --resume, "
                "discard its checkpoints and records with --overwrite, or choose a new --out_dir")
    doomed = [p.name for p in step_folders(out_dir)] + [n for n in RUN_FILES if (out_dir / n).exists()]
    if used and not ours and doomed:
        return (f"--overwrite: {out_dir} is no run of this trainer (it has no .lock); it would have "
                f"deleted {', '.join(doomed)}; choose a new --out_dir")
    return None


def save(out_dir: Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """step-N: write(folder) fills a temporary folder, which is flushed to disk and renamed into
    place; then the steps older than N beyond the newest `keep` are deleted. Newer ones (left by a
    run this one resumed before) stay: they did not load, and may be another version's."""
    final = Path(out_dir) / f"step-{step:06d}"
    with replaced(final) as tmp:
        tmp.mkdir(parents=True)
        try:
            write(tmp)
            for path in [*tmp.iterdir(), tmp]:
                fsync(path)
        except Exception as err:  # each library words a full disk its own way
            if not out_of_space(err, tmp):
                raise
            raise UserError(f"out of disk space in {out_dir}: {final.name} was not saved, the steps "
                            "before it are intact; free some space, then --resume") from None
    fsync(final.parent)  # the rename is on disk before any older step goes
    for folder in [p for p in step_folders(out_dir) if step_of(p) < step][keep - 1 :]:
        remove(folder)
    return final


def out_of_space(err: Exception, folder: Path) -> bool:
    """A write refused for want of space: the OS's errno says so, or a library lost it (torch.save:
    'iostream error', 'unexpected pos'; safetensors its own) on a disk with under 1 MiB free."""
    full = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    return full or shutil.disk_usage(folder).free < 2**20


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_newest(path: Path, load: Callable[[Path], object]) -> tuple[Path, object]:
    """(model folder, load(model folder)) for a model folder (it has config.json) or a run folder,
    whose step folders are tried newest first: one that fails to load is named in a warning and the
    one before it tried. load raises UserError to refuse what it was given; any other error means
    the folder is damaged."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: no such folder; pass the trainer's --out_dir or a model folder")
    candidates = [path] if (path / "config.json").is_file() else step_folders(path)
    if not candidates:
        raise UserError(f"{path}: no checkpoint (no config.json, no step-N folder); has the run saved "
                        "one?")
    failures = []
    for folder in candidates:
        try:
            return folder, load(folder)
        except UserError:
            raise
        except Exception as err:  # a truncated or missing file fails in whichever library reads it
            failures.append(f"{folder.name}: {first_line(err)}")
            if folder is not candidates[-1]:
                print(f"warning: {folder} cannot be loaded ({first_line(err)}); trying the one before",
                      file=sys.stderr)
    raise UserError(f"{path}: no checkpoint loads ({'; '.join(failures)})")
