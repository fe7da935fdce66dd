"""A run directory (the trainer's --out_dir): the one run it belongs to, its checkpoints, and resuming that run.
Its layout and guarantees are in docs/training.md; the last section fills in what older trainers did not record.
"""

import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from common.cli import UserError, cannot_write, first_line
from common.fs import (
    LockHeld,
    exclusive_lock,
    point_symlink,
    remove_leftovers,
    sha256_file,
    staged_directory,
    write_file_atomically,
)
from data import PackedTokens, save_tokenizer, tokenizer_fingerprint
from model import SWITCHES, MiniMindConfig, MiniMindForCausalLM
from model.model_minimind import with_implied
from trainer.tracking import read_metrics

LOCK_FILE = ".lock"
RECORD_FILES = ("metrics.jsonl", "summary.json", "layers.png")  # a run's records besides wandb/ and its checkpoints
LINK = "checkpoint"
STEP_FOLDER = re.compile(r"step-(\d+)")
STATE_FILE = "training_state.pt"
MANIFEST = "manifest.json"
# What every checkpoint's training state holds; state_with_defaults fills in the fields added since.
STATE_KEYS = ("step", "optimizer", "scaler", "sampler", "train_time", "wandb_run_id", "args", "rng")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
READ_ATTEMPTS = 10  # scans of a run directory whose checkpoint a running trainer replaces while it is read


# --- the directory and the run it belongs to ----------------------------------------------------------------


def step_folders(out_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete step folder in out_dir, newest first."""
    found = [(int(m.group(1)), p) for p in Path(out_dir).iterdir() if (m := STEP_FOLDER.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def find_checkpoints(out_dir: Path) -> list[Path]:
    """The checkpoints to try, best first: the link's target (in a copied run perhaps a real folder), then every
    step folder, newest first."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    link = out_dir / LINK
    found = [link.resolve()] if link.is_dir() else []
    found += [p.resolve() for _, p in step_folders(out_dir) if p.resolve() not in found]
    return found


def previous_run(out_dir: Path) -> list[str]:
    """What in out_dir belongs to an earlier run: its checkpoints, metrics or summary."""
    metrics = out_dir / "metrics.jsonl"
    found = [p.name for p in find_checkpoints(out_dir)]
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(metrics.name)
    if (out_dir / "summary.json").is_file():
        found.append("summary.json")
    return found


def no_checkpoint(out_dir: Path, resume: bool) -> UserError:
    """The refusal of an out_dir without a checkpoint, for --resume or a fresh run over a run's records."""
    records = previous_run(out_dir)
    if resume and not records:
        return UserError(f"--resume: no checkpoint in {out_dir}; run without --resume to start fresh")
    return UserError(f"{'--resume: ' if resume else ''}--out_dir {out_dir} holds the records of a run that "
                     f"saved no checkpoint ({', '.join(records)}), so there is nothing to resume: pass "
                     "--overwrite to discard them and start afresh, or choose a new --out_dir")


def discard_run(out_dir: Path) -> None:
    """--overwrite: delete the earlier run's checkpoints and records, and nothing else in the directory."""
    for path in [out_dir / LINK, *out_dir.glob("step-*"), *(out_dir / name for name in (*RECORD_FILES, "wandb"))]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()


def only_a_lock(out_dir: Path) -> bool:
    return out_dir.is_dir() and [p.name for p in out_dir.iterdir()] == [LOCK_FILE]


@contextmanager
def claim_run_dir(out_dir: Path, resume: bool, overwrite: bool) -> Iterator[None]:
    """Own out_dir for the block: create it, lock it, and refuse another run's directory unless resuming it or
    told to overwrite it. A directory that was new, or held only a killed trainer's lock file, is removed again
    if the run leaves nothing in it."""
    created = not out_dir.exists() or only_a_lock(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (LOCK_FILE, *RECORD_FILES):  # (something else put there: the trainer would fail on it only later)
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
                    raise no_checkpoint(out_dir, resume=False)
                raise UserError(f"--out_dir {out_dir} holds another run ({', '.join(found)}); continue it with "
                                "--resume, choose a new --out_dir, or pass --overwrite to discard it")
            if leftovers := remove_leftovers(out_dir):
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


# --- checkpoints: saving, checking, loading -----------------------------------------------------------------


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


def save_checkpoint(out_dir: Path, model: MiniMindForCausalLM, tokenizer, training_state: dict, keep: int) -> Path:
    """Write this step's checkpoint, point the link at it and keep the newest `keep` step folders. A failed write
    is a UserError that leaves the previous checkpoint untouched."""
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
    """Raise Damaged unless path has config.json, weights, and every file its manifest lists, of that size and
    content. Every reader of a checkpoint, --resume included, checks it here first."""
    if not (path / "config.json").is_file():
        raise Damaged("no config.json")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise Damaged(f"has config.json but no weights (none of {', '.join(WEIGHT_FILES)})")
    if not (path / MANIFEST).is_file():
        if (path / STATE_FILE).is_file():  # an export, without a training state, never has a manifest
            print(f"note: {path} has no {MANIFEST} (saved before manifests existed), so its files are not checked",
                  file=sys.stderr)
        return
    for name, (size, digest) in json.loads((path / MANIFEST).read_text()).items():
        file = path / name
        if not file.is_file():
            raise Damaged(f"{name} is missing")
        if file.stat().st_size != size:
            raise Damaged(f"{name} has {file.stat().st_size:,} bytes, not {size:,}")
        if sha256_file(file) != digest:
            raise Damaged(f"{name} is corrupt (its checksum changed)")


def load_checkpoint(out_dir: Path, repair: bool = False) -> tuple[MiniMindForCausalLM, dict]:
    """The model (fp32, as saved) and training state of the best checkpoint in out_dir that loads; each one that
    does not is reported in one line. With repair (by the owner of out_dir) those are renamed <name>.damaged-<time>,
    never tried again, and the link points to the one loaded. The caller restores RNGs when it is ready."""
    damaged: dict[Path, str] = {}
    for path in find_checkpoints(out_dir):
        try:
            verify(path)
            model = MiniMindForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
            state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
            if missing := [key for key in STATE_KEYS if key not in state]:
                raise ValueError(f"{STATE_FILE} lacks {', '.join(missing)}")
        except Exception as err:  # truncated, missing or garbled files fail in many libraries, each its own way
            damaged[path] = first_line(err)
            print(f"warning: checkpoint {path.name} cannot be loaded ({damaged[path]}); trying an earlier one",
                  file=sys.stderr)
            continue
        if repair and damaged:
            for bad in damaged:
                bad.rename(bad.with_name(f"{bad.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"))
            point_symlink(Path(out_dir) / LINK, path.name)
        return model, state_with_defaults(state, model.config.vocab_size)
    if not damaged:
        raise no_checkpoint(out_dir, resume=True)
    failures = "; ".join(f"{p.name}: {why}" for p, why in damaged.items())
    raise UserError(f"--resume: no checkpoint in {out_dir} can be loaded ({failures}); start over with --overwrite "
                    "or in a new --out_dir")


def read_model_dir(path: Path, load: Callable[[Path], Any]) -> tuple[Path, Any]:
    """(model directory, load(model directory)) for a model directory or a run directory, whose checkpoints are
    tried as --resume tries them (docs/training.md, "Reading checkpoints"). load raises UserError to refuse
    (passed on as it is); any other exception means the checkpoint is damaged.
    """
    failed: dict[Path, str] = {}
    for _ in range(READ_ATTEMPTS):
        if not path.is_dir():
            problem = "is not a directory" if path.exists() else "no such directory"
            raise UserError(f"{path}: {problem}; pass the trainer's --out_dir or a checkpoint folder")
        named = (path / "config.json").is_file()
        try:  # each candidate resolved here, once: a save cannot mix two steps under load
            candidates = [path.resolve()] if named else [p for p in find_checkpoints(path) if p not in failed]
        except OSError as err:  # a folder this user may not list
            raise UserError(f"{path}: cannot be read ({err.strerror or first_line(err)})") from None
        links = link_targets(path)
        for candidate in candidates:
            try:
                verify(candidate)
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
    """Where path and its checkpoint link lead now: a save flips the link before it deletes the folders it
    replaces, so a change here tells a folder deleted under a reader from a damaged one."""
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


# --- resuming the run ---------------------------------------------------------------------------------------


def data_fingerprint(tokenizer, train_data: PackedTokens, val_data: PackedTokens) -> dict:
    """What the run trains and evaluates on, whatever the paths were called."""
    return {"tokenizer": tokenizer_fingerprint(tokenizer),
            **{d.split: {"num_tokens": d.num_tokens, "sha256": d.sha256} for d in (train_data, val_data)}}


def check_resumable(state: dict, config: MiniMindConfig, args, data: dict, world_size: int) -> None:
    """Refuse, in one line, a --resume that would not continue the same run: the flags whose role fixes what the
    run computes, the architecture flags given, the data, the tokenizer and the number of processes must match."""
    from trainer.args import DATA, FIXED, config_fields, flags_with  # (here: args imports this module)

    saved = state["args"]
    # A checkpoint saved before data fingerprints must name its data with the same flags.
    for name in flags_with(FIXED) + (() if state["data"] else flags_with(DATA)):
        if recorded_value(saved, name) != getattr(args, name):
            raise UserError(f"--resume: the checkpoint was trained with --{name} {recorded_value(saved, name)}, not "
                            f"{getattr(args, name)}; pass the same value (or start a new --out_dir)")
    for flag, field in config_fields().items():
        given = getattr(args, flag)
        if given is not None and given != getattr(config, field):
            raise UserError(f"--resume: the checkpoint's model has --{flag} {getattr(config, field)}, not {given}; "
                            "pass the same value (or start a new --out_dir for another model)")
    recorded = state["data"] or data  # (a checkpoint without a fingerprint had its data flags compared above)
    if recorded["tokenizer"] != data["tokenizer"]:
        raise UserError(f"--resume: --tokenizer_path {args.tokenizer_path or 'default'} is not the tokenizer the "
                        "checkpoint was trained with (a copy of that one is in the checkpoint folder); pass it, "
                        "or start a new --out_dir")
    for split in ("train", "validation"):
        if recorded[split] != data[split]:
            raise UserError(f"--resume: the {split} split of --data_path {args.data_path or 'default'} is not the "
                            f"data the checkpoint was trained on ({recorded[split]['num_tokens']:,} tokens then, "
                            f"{data[split]['num_tokens']:,} now; was it edited?); pass the original data, or "
                            "start a new --out_dir")
    if len(state["sampler"]) != world_size:
        raise UserError(f"--resume: the checkpoint was written by {len(state['sampler'])} processes, not "
                        f"{world_size}; resume with the same number of processes")


def keep_metrics_up_to(path: Path, step: int) -> None:
    """On resume, drop records the interrupted run logged after its last checkpoint (they are redone)."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r["step"] <= step]
        write_file_atomically(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in kept).encode()))


# --- compatibility with runs and checkpoints written by older versions of the trainer -----------------------
# What stands in for each thing a newer trainer records and an older one did not: the behaviour the run had.
# Two more sit where they are checked: verify loads a checkpoint without a manifest unchecked, and
# check_resumable compares the data flags of one without a data fingerprint.


def implied_by_record(field: str):
    """A switch whose default the config derives from others (HybridNorm's QKV-norm), derived from a record."""
    return lambda saved: getattr(with_implied({s.name: saved[s.flag_name] for s in SWITCHES if s.flag_name in saved}),
                                 field)


# Flags added since a run was recorded whose default depends on other flags: the value the run had in effect.
RECORDED_BEFORE = {"diag_interval": lambda saved: saved.get("log_interval"),
                   **{s.flag_name: implied_by_record(s.name) for s in SWITCHES if s.default is None}}


def recorded_value(saved: dict, flag: str):
    """The value of `flag` a recorded run (the args in its summary or checkpoint) was trained with: a flag added
    since has the old behaviour as its parser default, or as its entry in RECORDED_BEFORE."""
    from trainer.args import build_parser  # (here: trainer.args imports this module)

    if flag in saved:
        return saved[flag]
    if flag in RECORDED_BEFORE:
        return RECORDED_BEFORE[flag](saved)
    return build_parser().get_default(flag)


def state_with_defaults(state: dict, vocab_size: int) -> dict:
    """A checkpoint's training state with each field it lacks (one added since STATE_KEYS) as the run had it."""
    defaults = {
        "compile_time": 0.0, "untimed_steps": 0,  # before the warm-up step was timed apart: none was
        # before the divergence checks kept what they had seen: measured from ln V, as if nothing had been
        "start_loss": math.log(vocab_size), "lowest_loss": math.inf, "spiked": False,
        # before the loss window was kept: a new one starts, so the first record after the resume covers fewer steps
        "window": {"loss_sums": [0.0] * len(state["sampler"]), "steps": 0, "untimed": 0, "start": state["train_time"]},
        "data": None,  # before data fingerprints: check_resumable compares the data flags instead
    }
    return {**defaults, **state}
