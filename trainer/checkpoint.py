"""A run folder (the trainer's --out_dir) as files:
claiming it, writing a step, loading the newest step that loads, keeping the newest k.
What a step holds and what --resume checks are the trainer's.

    out/pretrain/.lock              held by the trainer writing here
                                    (an flock: the kernel drops it at exit);
                                    it holds the run's id, which marks the folder
                                    as a run of this trainer
                                    and names its wandb run (wandb/*-<id>)
    out/pretrain/step-000400/       one checkpoint, whatever the trainer writes into it
    out/pretrain/metrics.jsonl      every logged record;
                                    summary.json and layers.png at the end

A step folder is written under a temporary name, flushed to disk and renamed into place,
so one that exists is complete; older steps are pruned only after that.
The newest that loads is the checkpoint (found by name, as in torchtitan).
"""

import contextlib
import fcntl
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from common.cli import UserError, first_line
from common.fs import remove, replaced, space_needed, temporary
from data.tokenizer import load_tokenizer, tokenizer_fingerprint

# As save() names them, step-{step:06d}:
# six digits, or more without a leading zero (not step-2024)
STEP_FOLDER = re.compile(r"step-(\d{6}|[1-9]\d{6,})")
# What a run writes beside its steps and wandb runs;
# --overwrite deletes these, nothing else.
RUN_FILES = ("metrics.jsonl", "summary.json", "layers.png")
# the trainer's, in each step folder beside the model's files
STATE_FILE = "training_state.pt"
# then the run's id: a .lock that says so is the trainer's
LOCK_MARK = "minimind-norm trainer run "


def step_of(folder: Path) -> int:
    return int(STEP_FOLDER.fullmatch(folder.name)[1])


def step_folders(out_dir: Path) -> list[Path]:
    """The step-N folders of a run folder, newest first."""
    found = [p for p in Path(out_dir).glob("step-*")
             if STEP_FOLDER.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=step_of, reverse=True)


def newest_up_to(out_dir: Path, step: int) -> Path | None:
    """The run's newest step folder up to step
    (a newer one is a step --resume skipped)."""
    return next((p for p in step_folders(out_dir) if step_of(p) <= step), None)


def claim(out_dir: Path, resume: bool, overwrite: bool) -> int:
    """Take out_dir for this run; return the descriptor that holds it (while it is open).
    Refused in one line: a folder another trainer holds,
    a fresh run's used folder without --overwrite,
    and an --overwrite of a folder that is no run of this trainer.
    Deletes nothing (start() does)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = out_dir / ".lock"
    # never followed: a dangling one would create its target, outside
    if lock.is_symlink():
        raise UserError(f"{lock} is a link, not the trainer's lock file; "
                        "choose another --out_dir")
    existed = lock.exists()
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"--out_dir {out_dir} is in use by another trainer; "
                        "wait for it, or choose another") from None
    ours = run_id(fd) is not None or (existed and earlier_versions_run(out_dir, fd))
    if problem := fresh_run_problem(out_dir, resume, overwrite, ours):
        if not existed:
            lock.unlink()  # a folder that is not a run's is left as it was
        os.close(fd)  # (a refused run in a process that trains again must not hold it)
        raise UserError(problem)
    return fd


def run_id(lock: int) -> str | None:
    """The id in the held .lock, if the trainer wrote it
    (else another tool's, or an empty one)."""
    text = os.pread(lock, 200, 0).decode(errors="replace")
    return text.removeprefix(LOCK_MARK).strip() if text.startswith(LOCK_MARK) else None


def earlier_versions_run(out_dir: Path, lock: int) -> bool:
    """A run folder of a version before .lock held an id: its empty .lock beside step folders
    that hold the trainer's own training state."""
    if os.fstat(lock).st_size:
        return False
    return any((folder / STATE_FILE).is_file() for folder in step_folders(out_dir))


def runs_in(folder: Path) -> str:
    """The runs inside folder (e.g. `out`, or a study's runs/), listed for a message;
    "" where there are none."""
    runs = sorted({p.parent for pattern in ("*/step-*", "runs/*/step-*")
                   for p in folder.glob(pattern) if STEP_FOLDER.fullmatch(p.name)})
    return ", ".join(map(str, runs[:3])) + (", ..." if len(runs) > 3 else "")


def fresh_run_problem(out_dir: Path, resume: bool, overwrite: bool,
                      ours: bool) -> str | None:
    has_steps = bool(step_folders(out_dir))
    runs = "" if has_steps else runs_in(out_dir)
    if runs:  # the folder the runs are in, given for one of them
        return (f"--out_dir {out_dir} holds runs ({runs}); pass one of them "
                "with --resume, or choose a new --out_dir")
    used = any(p.name != ".lock" for p in out_dir.iterdir())
    if resume and not has_steps:
        # e.g. a run killed before its first save: its records are there
        afresh = ("without --resume" if not used
                  else "with --overwrite instead" if ours else "in a new --out_dir")
        return f"--resume: no checkpoint in {out_dir}; start afresh {afresh}"
    if resume:
        return None
    if used and not overwrite:
        return (f"--out_dir {out_dir} is not empty (an earlier run?); "
                "continue it with --resume, "
                "discard its checkpoints and records with --overwrite, "
                "or choose a new --out_dir")
    if used and not ours:
        return (f"--overwrite: {out_dir} is no run of this trainer "
                "(no .lock that the trainer wrote), "
                "so nothing in it is the trainer's to delete; choose a new --out_dir")
    return None


def start(out_dir: Path, lock: int, resume: bool) -> str:
    """Once the run can start (its data, tokenizer and model loaded): the run's id.
    A fresh run deletes what the run before it wrote
    (step folders, RUN_FILES, its wandb run) and writes its new id into .lock."""
    old = run_id(lock)
    if resume and old:
        return old
    if not resume:  # (old is None only where claim() found nothing but .lock)
        for folder in step_folders(out_dir):
            remove_step(folder)
        # wandb's [offline-]run-<time>-<id>; a step's temporary folder left by a kill
        wandb_runs = (out_dir / "wandb").glob(f"*-{old}")
        for path in [*(out_dir / name for name in RUN_FILES), *wandb_runs,
                     *out_dir.glob(".step-*.tmp")]:
            remove(path)
    new = uuid.uuid4().hex[:12]
    if old or not os.fstat(lock).st_size:  # another tool's .lock keeps its words
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{LOCK_MARK}{new}\n".encode(), 0)
    return new


def save(out_dir: Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """step-N: write(folder) fills a temporary folder,
    which is flushed to disk and renamed into place;
    then the steps older than N beyond the newest `keep` are deleted.
    Newer ones (left by a run this one resumed before) stay:
    they did not load, and may be another version's;
    one in the way of this step is renamed, never replaced."""
    final = Path(out_dir) / f"step-{step:06d}"
    if final.exists():
        kept = final.with_name(
            f"{final.name}-not-loaded-{time.strftime('%Y%m%d-%H%M%S')}")
        final.rename(kept)
        tqdm.write(f"warning: {final} did not load on --resume "
                   f"(another version's, or damaged); kept as {kept.name}, "
                   f"and this run's step {step} saved in its place", file=sys.stderr)
    before = ("the steps before it are intact; free some space, then --resume"
              if newest_up_to(out_dir, step)
              else "nor any step before it; "
                   "free some space, then start again with --overwrite")
    with (replaced(final) as tmp,
          space_needed(out_dir, f"{final.name} was not saved, {before}")):
        tmp.mkdir(parents=True)
        write(tmp)
        for path in [*tmp.iterdir(), tmp]:
            fsync(path)
    fsync(final.parent)  # the rename is on disk before any older step goes
    for folder in [p for p in step_folders(out_dir) if step_of(p) < step][keep - 1 :]:
        remove_step(folder)
    return final


def remove_step(folder: Path) -> None:
    """Delete a step folder whole: renamed out of its name first, so that a kill midway
    leaves no partial step-N (only the hidden .step-N.tmp a kill during a save leaves)."""
    hidden = temporary(folder)
    remove(hidden)
    folder.rename(hidden)
    remove(hidden)


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_folder(path) -> Path:  # a step folder's run folder; any other folder itself
    path = Path(os.path.abspath(path))  # "..": its name, and links kept as named
    return path.parent if STEP_FOLDER.fullmatch(path.name) else path


def load_newest(path: Path, load: Callable[[Path], object]) -> tuple[Path, object]:
    """(model folder, load(model folder)) for a model folder (it has config.json)
    or a run folder, whose step folders are tried newest first:
    one that fails to load is named in a warning and the one before it tried.
    load raises UserError to refuse what it was given;
    any other error means the folder is damaged."""
    path = Path(path)
    # what MiniMind's trainers save (weights alone), or their out folder
    minimind = ((path.is_file() and path.suffix == ".pth")
                or (any(path.glob("*.pth")) and not step_folders(path)))
    if minimind and not (path / "config.json").is_file():
        raise UserError(f"{path}: .pth weights without a config.json (what MiniMind's trainers "
                        "save); import them into a model folder with "
                        "extras/interop/convert_from_minimind.py first")
    if not path.is_dir():
        what = "a file, not a folder" if path.exists() else "no such folder"
        raise UserError(f"{path}: {what}; "
                        "pass the trainer's --out_dir or a model folder")
    candidates = [path] if (path / "config.json").is_file() else step_folders(path)
    if not candidates:
        # e.g. the folder the runs are in, `out`, for a run folder in it
        if runs := runs_in(path):
            raise UserError(f"{path}: holds runs, not a checkpoint; pass one of them ({runs})")
        raise UserError(f"{path}: no checkpoint (no config.json, no step-N folder); "
                        "has the run saved one?")
    failures = []
    for folder in candidates:
        try:
            return folder, load(folder)
        except UserError:
            raise
        # a truncated or missing file fails in whichever library reads it
        except Exception as err:
            failures.append(f"{folder.name}: {first_line(err)}")
            if folder is not candidates[-1]:
                print(f"warning: {folder} cannot be loaded ({first_line(err)}); "
                      "trying the one before", file=sys.stderr)
    raise UserError(f"{path}: no checkpoint loads ({'; '.join(failures)})")


def read_state(folder: Path) -> dict | None:
    """A step folder's training state (flags, data, counters) as the trainer wrote it;
    None where there is none that loads (missing, damaged, or another tool's)."""
    with contextlib.suppress(Exception):
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True,
                           mmap=True)
        if isinstance(state, dict) and isinstance(state.get("args"), dict):
            return state
    return None


def newest_state(run: Path) -> dict | None:
    """The training state of the run's newest step that has one (read_state)."""
    for folder in step_folders(run):
        state = read_state(folder)
        if state is not None:
            return state
    return None


def tokenizer_problem(folder: Path, tokenizer) -> str | None:
    """Why tokenizer is not the one the model in folder trained with, by content
    (one of the same size can split text otherwise):
    as its training state records it, else its tokenizer.json."""
    # no state, or an older one without the data's record: no record
    recorded = (read_state(folder) or {}).get("data", {}).get("tokenizer")
    if recorded is None and (folder / "tokenizer.json").is_file():
        recorded = tokenizer_fingerprint(load_tokenizer(folder))
    given = tokenizer_fingerprint(tokenizer)
    if recorded in (None, given):
        return None
    return (f"{folder}: the tokenizer (fingerprint {given}) "
            f"is not the one its model was trained with ({recorded})")
