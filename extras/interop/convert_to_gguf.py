"""Export a MiniMind checkpoint as one GGUF file for llama.cpp (and the tools built on it, such as Ollama).

    python extras/interop/convert_to_gguf.py out/pretrain out/model.gguf [--outtype f32|f16|bf16]

Pre-Norm RMSNorm exports as GGUF architecture "llama", with --qk_norm head as "qwen3", and reorder + RMSNorm +
--qk_norm proj as "olmo2" (hf_export.py's allowlist); anything else is refused in one line. Before it is kept,
the file is read back with the gguf package: every tensor and the vocabulary must equal the export's, or
nothing is written. Tensor layout, tokenizer and what was verified: docs/gguf.md.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gguf
import torch
from transformers.utils import logging as hf_logging

from common.cli import ArgumentParser, UserError, run_cli
from common.fs import replaced, space_needed
from data.tokenizer import load_tokenizer
from extras.interop.export import export_model
from trainer.checkpoint import run_folder, tokenizer_problem

ARCHITECTURES = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen3": gguf.MODEL_ARCH.QWEN3,
                 "olmo2": gguf.MODEL_ARCH.OLMO2}
# Families whose llama.cpp loader requires output.weight even when it would equal the embeddings.
NEEDS_OUTPUT = {"olmo2"}
# --outtype -> (how matrices are stored, general.file_type, the torch dtype that rounds the same way).
# Vectors (norm gains) stay float32 in every type, as llama.cpp's own converter keeps them.
OUTTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32, torch.float32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16, torch.float16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16, torch.bfloat16),
}
# What llama.cpp's "gpt-2" pre-tokenizer does: GPT-2's split regex on raw bytes, no prefix space, no
# normalizer. (tokenizer model, pre-tokenizer type, add_prefix_space, use_regex, normalizer)
GPT2_BPE = ("BPE", "ByteLevel", False, True, None)


def interleave_rope_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder each head's rows from [x_0..x_{d/2-1}, y_0..y_{d/2-1}] to [x_0, y_0, x_1, y_1, ...]: Hugging
    Face's Llama rotates dimension i with i + d/2, llama.cpp's 2i with 2i + 1; q.k, so attention, is
    unchanged."""
    rows, cols = weight.shape
    return weight.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_tensors(hf_model, family: str) -> dict[str, torch.Tensor]:
    """GGUF tensor name -> float32 tensor in the layout llama.cpp reads for this family."""
    cfg = hf_model.config
    names = gguf.get_tensor_name_map(ARCHITECTURES[family], cfg.num_hidden_layers)
    tensors = {}
    for key, value in hf_model.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings and family not in NEEDS_OUTPUT:
            continue  # the loader falls back to token_embd.weight
        name = names.get_name(key, try_suffixes=(".weight",))
        if name is None:
            raise UserError(f"{key}: the gguf package has no {family} tensor name for it; "
                            "nothing was written")
        if family == "llama" and key.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in key else cfg.num_key_value_heads
            value = interleave_rope_halves(value, heads)
        tensors[name] = value.detach().float().contiguous()
    return tensors


def stored(tensors: dict[str, torch.Tensor], outtype: str) -> dict[str, torch.Tensor]:
    """The values the file will hold: matrices rounded to outtype (nearest even), vectors in float32. Refuses
    a weight too large for outtype (f16 ends at 65504): it would be stored as inf, and the read-back check
    cannot tell, since inf reads back as the inf it was rounded to."""
    dtype = OUTTYPES[outtype][2]
    values = {}
    for name, tensor in tensors.items():
        values[name] = tensor.to(dtype if tensor.dim() > 1 else torch.float32).float()
        if (values[name].isinf() & tensor.isfinite()).any():
            wider = " or ".join(t for t in ("bf16", "f32") if t != outtype)
            raise UserError(f"tensor {name} has values up to {tensor.abs().max().item():.4g} in magnitude, "
                            f"beyond --outtype {outtype}'s largest ({torch.finfo(dtype).max:g}), so it would "
                            f"be stored as inf; export with --outtype {wider}; nothing was written")
    return values


def vocabulary(tokenizer_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens in id order, their GGUF token types, merges as "left right") from tokenizer.json."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model, pre = spec["model"], spec.get("pre_tokenizer") or {}
    found = (model.get("type"), pre.get("type"), pre.get("add_prefix_space"), pre.get("use_regex"),
             spec.get("normalizer"))
    if found != GPT2_BPE:
        raise UserError(f"{tokenizer_dir}: GGUF export writes GPT-2-style byte-level BPE tokenizers only "
                        "(BPE model, ByteLevel pre-tokenizer with GPT-2's regex and no prefix space, no "
                        "normalizer)")
    by_id = {i: token for token, i in model["vocab"].items()}
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    by_id.update({i: t["content"] for i, t in added.items()})
    if sorted(by_id) != list(range(vocab_size)):
        raise UserError(f"{tokenizer_dir}: the tokenizer's ids are not exactly 0..{vocab_size - 1}, the "
                        f"model's vocabulary ({len(by_id)} tokens); export a checkpoint with its own "
                        "tokenizer")
    tokens = [by_id[i] for i in range(vocab_size)]
    types = [gguf.TokenType.NORMAL if i not in added else gguf.TokenType.CONTROL if added[i]["special"]
             else gguf.TokenType.USER_DEFINED for i in range(vocab_size)]
    # tokenizers writes a merge as "a b" (older files) or ["a", "b"]; byte-level tokens never hold a space.
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, [int(t) for t in types], merges


def write_gguf(path: Path, name: str, family: str, cfg, tensors, tokenizer, vocab, outtype: str) -> None:
    qtype, file_type, _ = OUTTYPES[outtype]
    tokens, types, merges = vocab
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[ARCHITECTURES[family]])
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.unk_token_id is not None:
        writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    # This repository's tokenizers: bos is the document separator, which every training document
    # follows and eval_llm puts before a prompt. MiniMind's bos starts its chat template instead.
    writer.add_add_bos_token(tokenizer.bos_token_id == tokenizer.eos_token_id)
    writer.add_add_eos_token(False)
    if tokenizer.chat_template:  # MiniMind's own tokenizer has one
        writer.add_chat_template(tokenizer.chat_template)

    for gguf_name, tensor in tensors.items():  # vectors (norm gains) stay float32
        kind = qtype if tensor.dim() > 1 else gguf.GGMLQuantizationType.F32
        writer.add_tensor(gguf_name, gguf.quants.quantize(tensor.numpy(), kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def self_check(path: Path, tensors: dict[str, torch.Tensor], vocab) -> None:
    """Raise UserError unless the file read back holds exactly these tensors and this vocabulary."""
    reader = gguf.GGUFReader(path)
    found = {t.name: t for t in reader.tensors}
    if set(found) != set(tensors):
        raise UserError(f"the GGUF file holds tensors {sorted(set(found) ^ set(tensors))} it should not, or "
                        "lacks them; nothing was written")
    for name, tensor in tensors.items():
        read = found[name]
        values = torch.from_numpy(gguf.quants.dequantize(read.data, read.tensor_type).copy())
        shape = tuple(int(n) for n in reversed(read.shape))
        if shape != tuple(tensor.shape) or not torch.equal(values.reshape(shape), tensor):
            raise UserError(f"tensor {name} read back from the GGUF file differs from the export; "
                            "nothing was written")
    keys = (gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.TOKEN_TYPE, gguf.Keys.Tokenizer.MERGES)
    for key, expected in zip(keys, vocab, strict=True):
        field = reader.get_field(key)
        if field is None or list(field.contents()) != expected:
            raise UserError(f"{key} read back from the GGUF file differs from tokenizer.json; "
                            "nothing was written")


def convert(src: Path, dst: Path, outtype: str = "f32") -> str:
    """Write the GGUF file and return its architecture name; UserError (nothing written) if it cannot."""
    if dst.exists():
        raise UserError(f"{dst} already exists; choose a new output file")
    if not dst.parent.is_dir():
        raise UserError(f"{dst.parent}: no such directory for the output file")
    model_dir, _, hf_model = export_model(src)
    family = hf_model.config.model_type
    if family not in ARCHITECTURES:
        raise UserError(f"a {family} model has no GGUF export here (only {', '.join(ARCHITECTURES)}: "
                        "llama.cpp's Gemma layout is not matched and checked); convert_to_hf.py exports it")
    if not (model_dir / "tokenizer.json").is_file():
        raise UserError(f"{model_dir}: has no tokenizer.json, and a GGUF file carries its tokenizer")
    tokenizer = load_tokenizer(model_dir)
    if problem := tokenizer_problem(model_dir, tokenizer):
        raise UserError(f"{problem}; nothing was written")
    vocab = vocabulary(model_dir, hf_model.config.vocab_size)
    tensors = gguf_tensors(hf_model, family)
    expected = stored(tensors, outtype)
    with replaced(dst) as tmp, space_needed(dst.parent, "nothing was written"):
        name = run_folder(src).name  # a step folder's run, as eval_llm names it
        write_gguf(tmp, name, family, hf_model.config, tensors, tokenizer, vocab, outtype)
        self_check(tmp, expected, vocab)
    print(f"wrote {family} GGUF ({outtype}, {len(tensors)} tensors, {len(vocab[0])} tokens, "
          f"{len(vocab[2])} merges) to {dst}; read back and checked")
    return family


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("src_dir", type=Path, help="the trainer's --out_dir, or a model folder (an imported "
                                                  "MiniMind .pth: docs/minimind-import.md)")
    parser.add_argument("dst_file", type=Path, help="the GGUF file to write (must not exist)")
    parser.add_argument("--outtype", choices=sorted(OUTTYPES), default="f32",
                        help="how weight matrices are stored (norm gains stay float32)")
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()  # the "Loading weights" bar is noise here, also beside an error line
    convert(args.src_dir, args.dst_file, args.outtype)


if __name__ == "__main__":
    run_cli(main)
