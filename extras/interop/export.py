"""A trainer checkpoint as the transformers model that computes the same function (hf_export.py picks the
family), for the converters beside this file."""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import model  # noqa: F401  (registers MiniMind with the Auto classes)
from common.cli import UserError
from extras.interop.hf_export import hf_config, hf_family
from model import MiniMindForCausalLM
from trainer.checkpoint import load_newest


def export_model(src: Path) -> tuple[Path, MiniMindForCausalLM, torch.nn.Module]:
    """(model folder, the MiniMind model, the float32 transformers model with the same weights) for a model
    folder or a run folder (its newest step that loads); a one-line UserError for a checkpoint no allowlisted
    family computes exactly, or for one that does not load."""
    def read(folder: Path):
        # never the folder's own code (auto_map); a damaged config.json: load_newest falls back
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        if cfg.model_type != "minimind":
            raise UserError(f"{folder} holds a {cfg.model_type!r} model, not a MiniMind checkpoint")
        try:
            family = hf_family(cfg)
        except ValueError as err:
            raise UserError(f"cannot export this checkpoint: {err}") from None
        return cfg, family, MiniMindForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    folder, (cfg, family, source) = load_newest(Path(src), read)
    target = AutoModelForCausalLM.from_config(hf_config(cfg, family), dtype=torch.float32)
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    if unexpected or any(not key.endswith("norm.weight") for key in missing):
        raise UserError(f"{folder}: weights do not match the {type(target).__name__} layout "
                        f"(missing {missing}, unexpected {unexpected})")
    with torch.no_grad():
        for key in missing:  # parameter-free RMSNorm has no gain: the equivalent is a gain of exactly 1
            target.get_parameter(key).fill_(1.0)
    return folder, source, target.eval()
