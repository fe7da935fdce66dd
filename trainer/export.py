"""A trainer checkpoint as the transformers model that computes the same function (model/hf_export.py picks the
family), for the converters in scripts/."""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import model  # noqa: F401  (registers MiniMind with the Auto classes)
from common.cli import UserError, first_line
from model import MiniMindForCausalLM
from model.hf_export import hf_config, hf_family
from trainer.run_dir import read_model_dir


def export_model(src: Path) -> tuple[Path, MiniMindForCausalLM, torch.nn.Module]:
    """(model directory, the MiniMind model, the float32 transformers model with the same weights), or a one-line
    UserError for a checkpoint no allowlisted family computes exactly, or a damaged one (see read_model_dir)."""
    def read(model_dir: Path):
        try:
            cfg = AutoConfig.from_pretrained(model_dir)
        except Exception as err:  # unknown model_type, malformed JSON, ...
            raise UserError(f"{model_dir}: cannot read config.json ({first_line(err)})") from None
        if cfg.model_type != "minimind":
            raise UserError(f"{model_dir} holds a {cfg.model_type!r} model, not a MiniMind checkpoint")
        try:
            family = hf_family(cfg)
        except ValueError as err:
            raise UserError(f"cannot export this checkpoint: {err}") from None
        return cfg, family, MiniMindForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    src, (cfg, family, source) = read_model_dir(Path(src), read)
    target = AutoModelForCausalLM.from_config(hf_config(cfg, family), dtype=torch.float32)
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    gains = [k for k in missing if k.endswith("norm.weight")]
    if unexpected or set(missing) != set(gains) or (gains and cfg.norm_type != "rmsnorm_noparam"):
        raise UserError(f"{src}: weights do not match the {type(target).__name__} layout "
                        f"(missing {missing}, unexpected {unexpected})")
    with torch.no_grad():
        for key in gains:  # parameter-free RMSNorm has no gain: the equivalent is a gain of exactly 1
            target.get_parameter(key).fill_(1.0)
    return src, source, target.eval()
