"""A run folder (the trainer's --out_dir): claiming it, its step-N checkpoints, and what --resume checks.

    out/pretrain/.lock              held by the trainer writing here (an flock: the kernel drops it at exit)
    out/pretrain/step-000400/       config.json, model.safetensors, tokenizer files, training_state.pt
    out/pretrain/metrics.jsonl      every logged record; summary.json and layers.png at the end

A step folder is written under a temporary name and renamed into place, so one that exists is complete. The
newest that loads is the checkpoint (found by name, as in torchtitan); --resume falls back to the one before.
"""

import fcntl
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from common.cli import UserError, first_line
from common.fs import remove, replaced, write_atomically
from data import PackedTokens, tokenizer_fingerprint
from model import SWITCHES, MiniMindForCausalLM
from trainer.args import MUST_MATCH
from trainer.tracking import read_metrics

STEP_FOLDER = re.compile(r"step-(\d+)")
STATE_FILE = "training_state.pt"
RUN_FILES = ("metrics.jsonl", "summary.json", "layers.png", "wandb")  # a run's records beside its steps


def step_folders(out_dir: Path) -> list[Path]:
    """The step-N folders of a run folder, newest first."""
    found = [(int(m[1]), p) for p in Path(out_dir).glob("step-*") if (m := STEP_FOLDER.fullmatch(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def claim(out_dir: Path, resume: bool, overwrite: bool) -> int:
    """Take out_dir for this run and return the descriptor that holds it (the claim lasts while it is open). A
    folder another trainer holds, or a fresh run's non-empty one without --overwrite, is refused in one
    line."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        used = any(p.name != ".lock" for p in out_dir.iterdir())
        problem = (f"--resume: no checkpoint in {out_dir}; run without --resume to start afresh"
                   if resume and not step_folders(out_dir) else
                   f"--out_dir {out_dir} is not empty (an earlier run?); continue it with --resume, discard "
                   "its checkpoints and records with --overwrite, or choose a new --out_dir"
                   if not resume and used and not overwrite else None)
    except BlockingIOError:
        problem = f"--out_dir {out_dir} is in use by another trainer; wait for it, or choose another"
    if problem:
        os.close(fd)  # (a refused run in a process that trains again, the ablation runner, must not hold it)
        raise UserError(problem)
    if not resume:
        for path in [*step_folders(out_dir), *(out_dir / name for name in RUN_FILES)]:
            remove(path)
    return fd


def save_checkpoint(out_dir: Path, model: MiniMindForCausalLM, tokenizer, state: dict, keep: int) -> Path:
    """Write step-N (N = state['step']) under a temporary name, rename it into place, then delete the step
    folders beyond the newest `keep` and any past N (left by the run this one resumed from an earlier
    step)."""
    final = Path(out_dir) / f"step-{state['step']:06d}"
    with replaced(final) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        rng = {"torch": torch.get_rng_state()} | (
            {"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_initialized() else {})
        torch.save({**state, "rng": rng}, tmp / STATE_FILE)
    newer = [p for p in step_folders(out_dir) if int(STEP_FOLDER.fullmatch(p.name)[1]) > state["step"]]
    for path in newer + [p for p in step_folders(out_dir) if p not in newer][keep:]:
        remove(path)
    return final


def load_newest(path: Path, load: Callable[[Path], object]) -> tuple[Path, object]:
    """(model folder, load(model folder)) for a model folder (it has config.json) or a run folder, whose step
    folders are tried newest first: one that fails to load is named in a warning and the one before it tried.
    load raises UserError to refuse what it was given; any other error means the folder is damaged."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: no such folder; pass the trainer's --out_dir or a model folder")
    candidates = [path] if (path / "config.json").is_file() else step_folders(path)
    if not candidates:
        raise UserError(f"{path}: no checkpoint (no config.json, no step-N folder); has the run saved one?")
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


def load_checkpoint(out_dir: Path) -> tuple[MiniMindForCausalLM, dict]:
    """--resume: the model (float32) and training state of the newest checkpoint that loads."""
    def load(folder: Path):
        model = MiniMindForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
        return model, torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)

    _, (model, state) = load_newest(out_dir, load)
    return model, state


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def data_fingerprint(tokenizer, train: PackedTokens, val: PackedTokens) -> dict:
    """What the run trains and evaluates on, whatever the paths were called."""
    return {"tokenizer": tokenizer_fingerprint(tokenizer),
            **{d.split: {"num_tokens": d.num_tokens, "sha256": d.sha256} for d in (train, val)}}


def check_resumable(state: dict, config, args, data: dict, world_size: int) -> None:
    """Refuse, in one line, a --resume that would not continue the same run: other data or tokenizer, another
    number of processes, or a flag of MUST_MATCH (trainer/args.py) or of the architecture set otherwise."""
    saved = state["args"]
    for name in MUST_MATCH:
        if saved[name] != getattr(args, name):
            raise UserError(f"--resume: the checkpoint was trained with --{name} {saved[name]}, not "
                            f"{getattr(args, name)}; pass the same value, or start a new --out_dir")
    for switch in SWITCHES:
        given, saved_value = getattr(args, switch.flag_name), getattr(config, switch.name)
        if switch.flag_name in args.arch_given and given != saved_value:
            raise UserError(f"--resume: the checkpoint's model has --{switch.flag_name} {saved_value}, not "
                            f"{given}; pass the same, or start a new --out_dir")
        if given is not None:  # (None: the device's default, in the records as in a fresh run's)
            setattr(args, switch.flag_name, saved_value)  # what the run's records say it trains
    for part in ("tokenizer", "train", "validation"):
        if state["data"][part] != data[part]:
            what = part if part == "tokenizer" else f"{part} split"
            raise UserError(f"--resume: the {what} is not the checkpoint's; pass the original --data_path "
                            "and --tokenizer_path, or start a new --out_dir")
    if len(state["sampler"]) != world_size:
        raise UserError(f"--resume: the checkpoint was written by {len(state['sampler'])} processes, not "
                        f"{world_size}; resume with the same number of processes")


def keep_metrics_up_to(path: Path, step: int) -> None:
    """On --resume, drop the records logged after the checkpoint's step: those steps are trained again."""
    if path.exists():
        write_atomically(path, "".join(json.dumps(r) + "\n" for r in read_metrics(path) if r["step"] <= step))
