"""Export a MiniMind checkpoint as a plain transformers LlamaForCausalLM directory.

    python scripts/convert_to_llama.py out/pretrain/checkpoint out/llama

Only Pre-Norm RMSNorm checkpoints (with or without gains) can be exported: that is exactly Llama's architecture,
and the module names already match, so the state dict is copied unchanged. The result loads without this
repo's code.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

import model  # noqa: F401  (registers MiniMind with the Auto classes)
from model import MiniMindForCausalLM
from model.llama_export import llama_config, why_not_llama
from trainer.checkpoint import resolve_model_dir
from trainer.cli import ArgumentParser, UserError, run_cli
from trainer.fs import staged_directory


def convert(src: Path, dst: Path) -> None:
    src = resolve_model_dir(src)
    if dst.exists():
        raise UserError(f"{dst} already exists; choose a new output directory")
    try:
        cfg = AutoConfig.from_pretrained(src)
    except Exception as err:  # unknown model_type, malformed JSON, ...
        raise UserError(f"{src}: cannot read config.json ({str(err).strip().splitlines()[0]})") from None
    if cfg.model_type != "minimind":
        raise UserError(f"{src} holds a {cfg.model_type!r} model, not a MiniMind checkpoint")
    reason = why_not_llama(cfg)
    if reason:
        raise UserError(f"cannot export this checkpoint: {reason}")

    src_model = MiniMindForCausalLM.from_pretrained(src, dtype="auto")
    llama = LlamaForCausalLM(llama_config(cfg)).to(src_model.dtype)
    missing, unexpected = llama.load_state_dict(src_model.state_dict(), strict=False)
    gains = [k for k in missing if k.endswith("norm.weight")]
    if unexpected or set(missing) != set(gains) or (gains and cfg.norm_type != "rmsnorm_noparam"):
        raise UserError(f"{src}: weights do not match the Llama layout (missing {missing}, unexpected {unexpected})")
    for key in gains:  # parameter-free RMSNorm has no gain: Llama's equivalent is a gain of exactly 1
        llama.get_parameter(key).data.fill_(1.0)
    with staged_directory(dst) as tmp:
        llama.save_pretrained(tmp)
        if any((src / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    print(f"wrote LlamaForCausalLM to {dst}")


def main() -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("src_dir", type=Path, help="the trainer's --out_dir, or a MiniMind checkpoint directory")
    parser.add_argument("dst_dir", type=Path, help="new directory for the Llama export (must not exist)")
    args = parser.parse_args()
    convert(args.src_dir, args.dst_dir)


if __name__ == "__main__":
    run_cli(main)
