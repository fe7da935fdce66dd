"""Checkpoints that survive a crash, are verified when loaded, and resume exactly.

out_dir/checkpoint is a symlink to the newest complete step folder, e.g. out_dir/step-000800/, which is an
ordinary Hugging Face model directory (config.json, model.safetensors, tokenizer) plus training_state.pt
(optimizer, step, sampler and RNG states, wandb run id, data fingerprint) and manifest.json (every other file's
size and sha256). A new step folder is written under a hidden name, renamed when complete, and only then does
the symlink flip (an atomic rename), so a crash at any moment leaves the previous checkpoint intact. The newest
few step folders are kept, and loading falls back to the newest earlier one when a checkpoint is damaged.
"""

import json
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from common.cli import UserError, cannot_write, first_line
from common.fs import point_symlink, sha256_file, staged_directory
from data.tokenizer import save_tokenizer
from model import MiniMindForCausalLM

LINK = "checkpoint"
STATE_FILE = "training_state.pt"
MANIFEST = "manifest.json"
STEP_FOLDER = re.compile(r"step-(\d+)")
STATE_KEYS = ("step", "optimizer", "scaler", "sampler", "train_time", "wandb_run_id", "args", "rng")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():  # only this process's device, and only if it used CUDA at all
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def step_folders(out_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete step folder in out_dir, newest first."""
    found = [(int(m.group(1)), p) for p in Path(out_dir).iterdir() if (m := STEP_FOLDER.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def find_checkpoints(out_dir: Path) -> list[Path]:
    """The checkpoints to try, best first: the link's target, then every step folder, newest first. A copied run
    directory may hold `checkpoint` as a real folder (a copy that followed the link); it comes first then."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    link = out_dir / LINK
    found = [link.resolve()] if link.is_dir() else []
    found += [p.resolve() for _, p in step_folders(out_dir) if p.resolve() not in found]
    return found


def save_checkpoint(out_dir: Path, model: MiniMindForCausalLM, tokenizer, training_state: dict, keep: int) -> Path:
    """Write this step's checkpoint, point the link at it and keep the newest `keep` step folders. A failed
    write (a full disk, lost permissions) is a UserError; the previous checkpoint is untouched then."""
    out_dir = Path(out_dir)
    step = training_state["step"]
    final = out_dir / f"step-{step:06d}"
    link = out_dir / LINK
    previous = link.resolve() if link.is_dir() else None
    try:
        if final.exists():
            shutil.rmtree(final)  # left by a crash before its link flip, so never the checkpoint
        with staged_directory(final) as tmp:
            model.save_pretrained(tmp)
            save_tokenizer(tokenizer, tmp)
            torch.save({**training_state, "rng": rng_state()}, tmp / STATE_FILE)
            manifest = {p.name: [p.stat().st_size, sha256_file(p)] for p in sorted(tmp.iterdir())}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)  # a copied run's real folder in place of the link; the new step supersedes it
        point_symlink(link, final.name)
    except (OSError, RuntimeError, SafetensorError) as err:  # torch and safetensors report write errors as these
        kept = f"the previous checkpoint ({previous.name}) is kept" if previous else "there is no earlier checkpoint"
        again = "--resume" if previous else "--overwrite"
        raise cannot_write(f"the checkpoint for step {step} in {out_dir}", err, f"{kept}: free some space or fix "
                           f"the permissions, then run again with {again}", free_in=out_dir) from None
    # Step folders past this step belong to a run that was resumed from an earlier checkpoint; they go too.
    kept = [p for s, p in step_folders(out_dir) if s <= step][:keep]
    for _, path in step_folders(out_dir):
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)
    return final


class Damaged(ValueError):
    """A checkpoint folder that fails the checks made before loading it (files missing, or not as its manifest says)."""


def verify(path: Path) -> None:
    """Raise Damaged if a file the manifest lists is missing or differs in size or content."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return  # written before manifests existed: loading it is the only check
    for name, (size, digest) in json.loads(manifest.read_text()).items():
        file = path / name
        if not file.is_file():
            raise Damaged(f"{name} is missing")
        if file.stat().st_size != size:
            raise Damaged(f"{name} has {file.stat().st_size:,} bytes, not {size:,}")
        if sha256_file(file) != digest:
            raise Damaged(f"{name} is corrupt (its checksum changed)")


def load_one(path: Path) -> tuple[MiniMindForCausalLM, dict]:
    verify(path)
    model = MiniMindForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"{STATE_FILE} lacks {', '.join(missing)}")
    return model, state


def load_checkpoint(out_dir: Path, repair: bool = False) -> tuple[MiniMindForCausalLM, dict]:
    """The model (fp32, exactly as saved) and training state of the best checkpoint in out_dir that loads
    completely; each one that does not is reported in one line. With repair (for the process that owns out_dir),
    those are renamed <name>.damaged, kept for inspection but never tried again, and the link points to the one
    loaded. The caller restores RNGs when it is ready."""
    failures, damaged = [], []
    for path in find_checkpoints(out_dir):
        try:
            loaded = load_one(path)
        except Exception as err:  # truncated, missing or garbled files fail in many libraries, each its own way
            failures.append(f"{path.name}: {first_line(err)}")
            damaged.append(path)
            print(f"warning: checkpoint {path.name} cannot be loaded ({first_line(err)}); trying an earlier one",
                  file=sys.stderr)
            continue
        if repair and damaged:
            for bad in damaged:
                bad.rename(bad.with_name(f"{bad.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"))
            point_symlink(Path(out_dir) / LINK, path.name)
        return loaded
    if not failures:
        raise UserError(f"--resume: no checkpoint in {out_dir}; run without --resume to start fresh")
    raise UserError(f"--resume: no checkpoint in {out_dir} can be loaded ({'; '.join(failures)}); start over "
                    "with --overwrite or in a new --out_dir")


READ_ATTEMPTS = 10  # scans of a run directory whose checkpoint a running trainer replaces while it is read


def checked_model_dir(path: Path) -> None:
    """Raise Damaged unless path has config.json, weights, and files that match its manifest (if any)."""
    if not (path / "config.json").is_file():
        raise Damaged("no config.json")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise Damaged(f"has config.json but no weights (none of {', '.join(WEIGHT_FILES)})")
    verify(path)
    if (path / STATE_FILE).is_file() and not (path / MANIFEST).is_file():
        print(f"note: {path} has no {MANIFEST} (saved before manifests existed), so its files are not checked",
              file=sys.stderr)


def read_model_dir(path: Path, load: Callable[[Path], Any]) -> tuple[Path, Any]:
    """(model directory, load(model directory)) for what a tool is pointed at: a model directory (a step folder,
    the checkpoint link, an export) or a run directory (the trainer's --out_dir). Every tool that reads a
    checkpoint comes through here, so each one checks it the same way.

    A checkpoint's files are checked against its manifest before load sees them; one without a manifest (older
    checkpoints, exports) is loaded unchecked. In a run directory the checkpoints are tried as --resume tries
    them (the link's target, then the step folders, newest first): any that fails the check or load is named in
    one warning line with the one used instead. A damaged folder named directly is a one-line UserError that
    says to pass the run directory. A folder that fails while the checkpoint link moved (or that vanished) was
    replaced by a running trainer's newer save (with --keep_checkpoints 1 the previous one is deleted at once),
    so the path is read again, at most READ_ATTEMPTS times. load raises UserError to refuse (passed on as it is); any other exception it raises
    means the checkpoint is damaged.
    """
    failed: dict[Path, str] = {}
    for _ in range(READ_ATTEMPTS):
        if not path.exists():
            raise UserError(f"{path}: no such directory; pass the trainer's --out_dir or a checkpoint folder")
        if not path.is_dir():
            raise UserError(f"{path}: is not a directory; pass the trainer's --out_dir or a checkpoint folder")
        named = (path / "config.json").is_file()
        try:  # each candidate resolved here, once: a save cannot mix two steps under load
            candidates = [path.resolve()] if named else [p for p in find_checkpoints(path) if p not in failed]
        except OSError as err:  # a folder this user may not list
            raise UserError(f"{path}: cannot be read ({err.strerror or first_line(err)})") from None
        links = link_targets(path)
        for candidate in candidates:
            try:
                checked_model_dir(candidate)
                loaded = load(candidate)
            except Exception as err:  # truncated, missing or garbled files fail in many libraries, each its own way
                if not candidate.is_dir() or link_targets(path) != links:
                    break  # a newer save replaced it (perhaps still deleting it) while it was read: scan again
                if isinstance(err, UserError):
                    raise  # load refuses what it was given, whichever checkpoint: no reason to try another
                if named:
                    raise unreadable(candidate, err) from None
                failed[candidate] = first_line(err)
                continue
            if failed or broken_link(path):
                print(f"warning: {path}: {skipped(path, failed)}; using {candidate.name}, the newest intact "
                      "checkpoint", file=sys.stderr)
            return candidate, loaded
        else:
            if failed or broken_link(path):
                raise UserError(f"{path}: no checkpoint can be loaded ({skipped(path, failed)}); restore a copy "
                                "of a step folder, or train again")
            raise UserError(f"{path}: not a model directory (no config.json, no {LINK} or step-* folders); has "
                            "the run saved a checkpoint?")
        print(f"note: {candidate.name} was replaced by a newer checkpoint while it was read; reading {path} again",
              file=sys.stderr)
    raise UserError(f"{path}: its checkpoint was replaced {READ_ATTEMPTS} times while it was read (a trainer "
                    "saving at every step?); try again, or once the trainer has stopped")


def link_targets(path: Path) -> tuple[Path, Path]:
    """Where path and its checkpoint link lead now. A save flips the link before it deletes the folders it
    replaces, so a change here tells a folder being deleted under a reader from a damaged one."""
    return path.resolve(), (path / LINK).resolve()


def unreadable(folder: Path, err: Exception) -> UserError:
    """A damaged model directory named directly, as one line that says which folder to pass instead."""
    reason = first_line(err) if isinstance(err, Damaged) else f"cannot load the model ({first_line(err)})"
    try:
        others = [p for p in find_checkpoints(folder.parent) if p != folder]
    except OSError:  # a parent this user may not list: no advice then
        others = []
    hint = f"; pass the run directory {folder.parent} to use its newest intact checkpoint" if others else ""
    return UserError(f"{folder}: {reason}{hint}")


def broken_link(out_dir: Path) -> bool:
    return (out_dir / LINK).is_symlink() and not (out_dir / LINK).exists()


def skipped(out_dir: Path, failed: dict[Path, str]) -> str:
    """What was passed over in a run directory: a broken link, and each checkpoint that failed, with why."""
    broken = [f"{LINK} -> {os.readlink(out_dir / LINK)} does not exist"] if broken_link(out_dir) else []
    return "; ".join(broken + [f"{p.name} is damaged ({why})" for p, why in failed.items()])
