"""Export a MiniMind checkpoint as a plain transformers LlamaForCausalLM directory.

    python scripts/convert_to_llama.py out/pretrain/checkpoint out/llama

Only Pre-Norm RMSNorm checkpoints can be exported: that is exactly Llama's architecture, and the module names
already match, so the state dict is copied unchanged. The result loads without this repo's code.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import model  # noqa: F401  (registers MiniMind with the Auto classes)
from model import MiniMindForCausalLM
from trainer.cli import UserError, run_cli
from trainer.fs import staged_directory

WHY_NOT = {
    "layernorm": "LayerNorm subtracts the mean and has a bias; Llama's RMSNorm has neither",
    "rmsnorm_noparam": "parameter-free RMSNorm could be written as RMSNorm with weight 1, but is kept separate "
    "so an export never silently changes the studied variant",
    "dyt": "DyT (tanh with a learnable scale) is not a normalization Llama has",
    "none": "Llama always normalizes; a model trained without norms would change behaviour",
}


def llama_config(cfg) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )


def convert(src: Path, dst: Path) -> None:
    if not (src / "config.json").is_file():
        raise UserError(f"{src} is not a model directory (no config.json); pass a checkpoint written by the trainer")
    if dst.exists():
        raise UserError(f"{dst} already exists; choose a new output directory")
    cfg = AutoConfig.from_pretrained(src)
    if cfg.model_type != "minimind":
        raise UserError(f"{src} holds a {cfg.model_type!r} model, not a MiniMind checkpoint")
    if cfg.norm_position != "pre":
        raise UserError(
            f"cannot export norm_position={cfg.norm_position!r}: Llama normalizes before each sublayer (Pre-Norm), "
            "a Post-Norm model computes a different function"
        )
    if cfg.norm_type != "rmsnorm":
        raise UserError(f"cannot export norm_type={cfg.norm_type!r}: {WHY_NOT[cfg.norm_type]}")

    src_model = MiniMindForCausalLM.from_pretrained(src, dtype="auto")
    llama = LlamaForCausalLM(llama_config(cfg)).to(src_model.dtype)
    llama.load_state_dict(src_model.state_dict(), strict=True)
    with staged_directory(dst) as tmp:
        llama.save_pretrained(tmp)
        if any((src / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    print(f"wrote LlamaForCausalLM to {dst}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src_dir", type=Path, help="MiniMind checkpoint directory (config.json + safetensors)")
    parser.add_argument("dst_dir", type=Path, help="new directory for the Llama export (must not exist)")
    args = parser.parse_args()
    convert(args.src_dir, args.dst_dir)


if __name__ == "__main__":
    run_cli(main)
