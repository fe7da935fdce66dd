"""Checkpoints that survive a crash, are verified when loaded, and resume exactly.

out_dir/checkpoint is a symlink to the newest complete step folder, e.g. out_dir/step-000800/, which is an
ordinary Hugging Face model directory (config.json, model.safetensors, tokenizer) plus training_state.pt
(optimizer, step, sampler and RNG states, wandb run id, data fingerprint) and manifest.json (every other file's
size and sha256). A new step folder is written under a hidden name, renamed when complete, and only then does
the symlink flip (an atomic rename), so a crash at any moment leaves the previous checkpoint intact. The newest
few step folders are kept, and loading falls back to the newest earlier one when a checkpoint is damaged.
"""

import json
import random
import re
import shutil
import sys
import time
from pathlib import Path

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


def verify(path: Path) -> None:
    """Raise ValueError if a file the manifest lists is missing or differs in size or content."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return  # written before manifests existed: loading it is the only check
    for name, (size, digest) in json.loads(manifest.read_text()).items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"{name} is missing")
        if file.stat().st_size != size:
            raise ValueError(f"{name} has {file.stat().st_size:,} bytes, not {size:,}")
        if sha256_file(file) != digest:
            raise ValueError(f"{name} is corrupt (its checksum changed)")


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


def resolve_model_dir(path: Path) -> Path:
    """The directory holding config.json and the weights: path itself, or the step folder the trainer's
    path/checkpoint link points to, resolved once so that a save during loading cannot mix two steps."""
    if not path.exists():
        raise UserError(f"{path}: no such directory; pass the trainer's --out_dir or a checkpoint folder")
    if not path.is_dir():
        raise UserError(f"{path}: is not a directory; pass the trainer's --out_dir or a checkpoint folder")
    if not (path / "config.json").is_file() and (path / LINK).is_dir():
        path = (path / LINK).resolve()
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: not a model directory (no config.json, no {LINK}/); has the run saved a checkpoint?")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise UserError(f"{path}: has config.json but no weights (none of {', '.join(WEIGHT_FILES)})")
    return path
