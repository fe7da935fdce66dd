"""Export a MiniMind checkpoint as a plain transformers model (Llama, Qwen3, OLMo 2, Gemma 2 or Gemma 3),
picked from its config by hf_export.py, which lists the configurations each family computes exactly.

    python extras/interop/convert_to_hf.py out/pretrain out/hf

The module names already match, so the state dict is copied unchanged. Before reporting success the written
directory is loaded with the plain transformers class, and its logits must match the MiniMind model's
(float32, max abs difference <= 1e-4); any other configuration, or a failed check, is refused with the reason
and nothing is written.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from transformers.utils import logging as hf_logging

from common.cli import ArgumentParser, UserError, run_cli
from common.fs import replaced, space_needed
from data import load_tokenizer
from extras.interop.export import export_model
from trainer.checkpoint import tokenizer_problem

TOLERANCE = 1e-4


def save_portable_tokenizer(tokenizer, folder: Path) -> None:
    """save_pretrained, with a tokenizer_config.json that transformers 4 reads too (llama.cpp's converter pins
    it): the generic fast class, whose ids are tokenizer.json's alone, and the further special tokens under
    the name both versions read (5 writes them as a list named extra_special_tokens, 4 reads it as a dict)."""
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("auto_map", None)  # a foreign tokenizer's own code, which the export does not carry
    if isinstance(config.get("extra_special_tokens"), list):
        config["additional_special_tokens"] = config.pop("extra_special_tokens")
    path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def convert(src: Path, dst: Path) -> str:
    """Write the export to dst and return the family's class name; UserError (nothing written) if not."""
    if dst.exists():
        raise UserError(f"{dst} already exists; choose a new output directory")
    src, source, target = export_model(src)
    tokenizer = None
    if (src / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(src)
        if problem := tokenizer_problem(src, tokenizer):
            raise UserError(f"{problem}; nothing was written")
    with replaced(dst) as tmp, space_needed(dst.parent, "nothing was written"):
        target.save_pretrained(tmp)
        if tokenizer:
            save_portable_tokenizer(tokenizer, tmp)
        # The self-check reads what was written, with transformers' own class and none of this repo's code.
        reloaded = type(target).from_pretrained(tmp, dtype=torch.float32).eval()
        ids = torch.randint(0, source.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = (source(input_ids=ids).logits - reloaded(input_ids=ids).logits).abs().max().item()
        if not diff <= TOLERANCE:
            raise UserError(f"the exported {type(target).__name__} differs from the checkpoint (max |logit "
                            f"difference| {diff:.2e} > {TOLERANCE:g}); nothing was written")
    untokenized = "" if tokenizer else f"; no tokenizer: {src} has no tokenizer.json"
    print(f"wrote {type(target).__name__} to {dst} (max |logit difference| {diff:.1e}){untokenized}")
    return type(target).__name__


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("src_dir", type=Path, help="the trainer's --out_dir, or a model folder (an imported "
                                                  "MiniMind .pth: docs/minimind-import.md)")
    parser.add_argument("dst_dir", type=Path, help="new directory for the export (must not exist)")
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()  # the bars of loading and writing weights beside the one result line
    convert(args.src_dir, args.dst_dir)


if __name__ == "__main__":
    run_cli(main)
