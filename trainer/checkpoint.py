"""Checkpoints that survive a crash and resume exactly.

out_dir/checkpoint is a symlink to the newest complete step folder, e.g. out_dir/step-000800/, which is an
ordinary Hugging Face model directory (config.json, model.safetensors, tokenizer) plus training_state.pt
(optimizer, step, sampler and RNG states, wandb run id). A new step folder is written under a hidden name,
renamed when complete, and only then does the symlink flip (an atomic rename), so a crash at any moment
leaves the previous checkpoint intact.
"""

import random
import shutil
from pathlib import Path

import numpy as np
import torch

from model import MiniMindForCausalLM
from trainer.cli import UserError
from trainer.fs import point_symlink, staged_directory

LINK = "checkpoint"
STATE_FILE = "training_state.pt"
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


def save_checkpoint(out_dir: Path, model: MiniMindForCausalLM, tokenizer, training_state: dict) -> Path:
    out_dir = Path(out_dir)
    name = f"step-{training_state['step']:06d}"
    final = out_dir / name
    link = out_dir / LINK
    if final.exists():
        if link.is_symlink() and link.resolve() == final.resolve():
            return final  # this very step is already the checkpoint
        shutil.rmtree(final)  # left by a crash between its rename and the link flip; never pointed to
    with staged_directory(final) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save({**training_state, "rng": rng_state()}, tmp / STATE_FILE)
    previous = link.resolve() if link.is_symlink() else None
    point_symlink(link, name)
    if previous is not None and previous != final.resolve():
        shutil.rmtree(previous, ignore_errors=True)
    return final


def load_checkpoint(out_dir: Path) -> tuple[MiniMindForCausalLM, dict]:
    """The model (fp32, exactly as saved) and the training state; the caller restores RNGs when it is ready."""
    path = Path(out_dir) / LINK
    model = MiniMindForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    return model, state


def resolve_model_dir(path: Path) -> Path:
    """The directory holding config.json and the weights: path itself, or the trainer's path/checkpoint."""
    if not path.exists():
        raise UserError(f"{path}: no such directory; pass the trainer's --out_dir or a checkpoint folder")
    if not path.is_dir():
        raise UserError(f"{path}: is not a directory; pass the trainer's --out_dir or a checkpoint folder")
    if not (path / "config.json").is_file() and (path / LINK).is_dir():
        path = path / LINK
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: not a model directory (no config.json, no {LINK}/); has the run saved a checkpoint?")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise UserError(f"{path}: has config.json but no weights (none of {', '.join(WEIGHT_FILES)})")
    return path
