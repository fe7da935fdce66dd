"""Import a MiniMind checkpoint (the .pth state dict MiniMind's trainers save) as a checkpoint of this
repository.

    python extras/interop/convert_from_minimind.py pretrain_512.pth minimind/model out/minimind2
    python extras/interop/convert_from_minimind.py pretrain_768.pth minimind/model out/minimind3 --version 3

MiniMind2 is a Pre-Norm RMSNorm Llama; MiniMind-3 adds per-head QK-norm, as Qwen3 does. The module names are
this repository's, so the weights carry over unchanged (as float32). The sizes come from the tensor shapes,
the rest from the flags, whose defaults are each version's published ones (docs/minimind-import.md). A key or
shape this model does not have (MiniMind's MoE variants, for instance) is refused in one line; nothing is
written.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from transformers.utils import logging as hf_logging

from common.cli import ArgumentParser, UserError, first_line, non_negative, positive_int, run_cli
from common.fs import replaced, space_needed
from data.tokenizer import load_tokenizer, tokenizer_fingerprint
from model import PRESETS, MiniMindConfig, MiniMindForCausalLM, norm_variant
from model.model_minimind import with_implied

# --version -> (name, preset): the preset (model/names.py) gives what the published config sets and the shapes
# do not reveal (QK-norm, head count, RMSNorm eps), so an import and `--preset` agree on what the model is.
VERSIONS = {"2": ("MiniMind2", "minimind2-small"), "3": ("MiniMind-3", "minimind3")}
ROPE_THETA, MAX_POSITIONS = 1e6, 32768  # both versions' published defaults
# The config fields a flag of the same name sets, over what the version implies.
FLAGS = ("num_attention_heads", "rms_norm_eps", "rope_theta", "max_position_embeddings")
LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.")


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a MiniMind .pth: a plain state dict, or the "model" entry of a *_resume.pth."""
    # torch.load reads a model folder's weights too, but their shapes are its config.json's
    if path.suffix in (".safetensors", ".bin"):
        raise UserError(f"{path}: a model folder's weights, not MiniMind's .pth; their folder's "
                        "config.json gives their shapes (eval_llm.py loads this repository's and "
                        "the exported families' folders as they are)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # no such file, not a torch file, truncated, objects weights_only refuses
        raise UserError(f"{path}: cannot read it as a PyTorch state dict ({first_line(err)})") from None
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
        saved = saved["model"]  # MiniMind's resume file: model, optimizer, epoch, step, ...
    if not isinstance(saved, dict) or not saved or not all(
            torch.is_tensor(v) and v.is_floating_point() for v in saved.values()):
        raise UserError(f"{path}: not a state dict of floating-point tensors")
    # A model holding nan or inf evaluates to nan and samples noise, and every later export fails on it
    for key, tensor in saved.items():
        if bad := int((~tensor.isfinite()).sum()):
            raise UserError(f"{path}: {key} holds {bad:,} non-finite values (nan or inf) of "
                            f"{tensor.numel():,}, so the run that saved it had diverged or the file is "
                            "damaged; import a checkpoint saved before that")
    return saved


def name_some(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def infer_config(weights: dict[str, torch.Tensor], name: str, preset: str, flags: dict, tied: bool,
                 tokenizer) -> MiniMindConfig:
    """The config of the MiniMind model these weights belong to: sizes from their shapes, the rest from the
    flags that are set (config field -> value or None), else from the version's preset and published
    defaults."""

    def rows(key: str) -> int:
        if key not in weights:
            raise UserError(f"the state dict has no {key}, which {name} has; is it a {name} checkpoint?")
        return weights[key].shape[0]

    switches = with_implied(PRESETS[preset])
    given = {field: value for field, value in flags.items() if value is not None}
    vocab_size, hidden = rows("model.embed_tokens.weight"), weights["model.embed_tokens.weight"].shape[1]
    layers = 1 + max((int(m.group(1)) for k in weights if (m := LAYER_KEY.match(k))), default=-1)
    q_width = rows("model.layers.0.self_attn.q_proj.weight")
    k_width = rows("model.layers.0.self_attn.k_proj.weight")
    heads = given.get("num_attention_heads")
    if switches.qk_norm == "head":  # MiniMind-3's q_norm spans one head, so the shapes give the head count
        head_dim = rows("model.layers.0.self_attn.q_norm.weight")
        if heads is not None and heads * head_dim != q_width:
            raise UserError(f"--num_attention_heads {heads} does not fit the weights: q_norm says heads of "
                            f"{head_dim}, q_proj has {q_width} rows, so {q_width // head_dim} heads")
        heads = q_width // head_dim
    else:
        heads = heads or switches.num_attention_heads
        head_dim = hidden // heads
    if q_width != hidden or hidden % heads:
        raise UserError(f"q_proj has {q_width} rows for hidden size {hidden} with {heads} heads; this "
                        "repository's attention needs heads x head size = hidden size (set "
                        "--num_attention_heads)")
    defaults = {"rms_norm_eps": switches.rms_norm_eps, "rope_theta": ROPE_THETA,
                "max_position_embeddings": MAX_POSITIONS}
    # no dense MLP (MiniMind's MoE variants): any width; the key check of import_minimind names the experts
    ffn = weights.get("model.layers.0.mlp.gate_proj.weight", weights["model.embed_tokens.weight"])
    shapes = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=k_width // head_dim,
                  intermediate_size=len(ffn))
    try:
        return MiniMindConfig(**defaults | given | shapes, norm_type="rmsnorm", norm_position="pre",
                              qk_norm=switches.qk_norm, tie_word_embeddings=tied,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    except ValueError as err:
        raise UserError(f"these weights give an invalid config: {err}") from None


def import_minimind(pth: Path, tokenizer_dir: Path, version: str = "auto",
                    **flags) -> tuple[MiniMindForCausalLM, object, str]:
    """(this repository's model holding the .pth's weights in float32, the tokenizer, the MiniMind version's
    name); UserError if the weights are not one MiniMind model this repository can hold. flags: FLAGS'
    fields."""
    weights = load_state_dict(pth)
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise UserError(f"{tokenizer_dir}: no tokenizer.json; pass MiniMind's tokenizer folder "
                        "(model/ in its repository)")
    tokenizer = load_tokenizer(tokenizer_dir)
    # of the same size as MiniMind's, so the size check below would let it through
    if tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(load_tokenizer()):
        raise UserError(f"{tokenizer_dir}: this repository's tokenizer (trained on the plays), not "
                        "MiniMind's; pass MiniMind's tokenizer folder (model/ in its repository)")
    if version == "auto":  # MiniMind-3 is the one with QK-norm
        version = "3" if any(k.endswith("self_attn.q_norm.weight") for k in weights) else "2"
    name, preset = VERSIONS[version]
    embed = weights.get("model.embed_tokens.weight")
    # MiniMind ties lm_head to the embeddings (MiniMind-3 optionally): a tied copy is saved twice, or not at
    # all.
    head = weights.get("lm_head.weight")
    tied = head is None or (embed is not None and torch.equal(head, embed))
    config = infer_config(weights, name, preset, flags, tied, tokenizer)
    if len(tokenizer) != config.vocab_size:
        raise UserError(f"{tokenizer_dir}: the tokenizer has {len(tokenizer)} tokens but the weights' "
                        f"vocabulary has {config.vocab_size}; pass the tokenizer folder of the MiniMind "
                        "version that trained them")
    model = MiniMindForCausalLM(config).eval()
    expected = model.state_dict()
    if tied:
        weights = {**weights, "lm_head.weight": embed}
    unknown, missing = set(weights) - set(expected), set(expected) - set(weights)
    if unknown or missing:
        raise UserError(f"{pth}: not a {name} state dict this repository's model can hold"
                        + (f"; unknown keys: {name_some(unknown)}" if unknown else "")
                        + (f"; missing keys: {name_some(missing)}" if missing else ""))
    if wrong := [k for k in expected if weights[k].shape != expected[k].shape]:
        raise UserError(f"{pth}: shapes do not fit one {name} model: " + ", ".join(
            f"{k} {tuple(weights[k].shape)} (expected {tuple(expected[k].shape)})" for k in wrong[:4]))
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    return model, tokenizer, name


def convert(pth: Path, tokenizer_dir: Path, dst: Path, **flags) -> MiniMindForCausalLM:
    if dst.exists():
        raise UserError(f"{dst} already exists; choose a new output directory")
    model, tokenizer, name = import_minimind(pth, tokenizer_dir, **flags)
    with replaced(dst) as tmp, space_needed(dst.parent, "nothing was written"):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    c = model.config
    print(f"imported {name} ({c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} "
          f"heads / {c.num_key_value_heads} KV, FFN {c.intermediate_size}, vocab {c.vocab_size}, "
          f"eps {c.rms_norm_eps:g}, rope theta {c.rope_theta:g}, "
          f"{'tied' if c.tie_word_embeddings else 'untied'} embeddings) as {norm_variant(c)} to {dst}")
    return model


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("pth", type=Path, help="MiniMind's saved weights, e.g. pretrain_512.pth")
    parser.add_argument("tokenizer_dir", type=Path, help="the MiniMind tokenizer folder (tokenizer.json, "
                                                         "tokenizer_config.json: MiniMind's model/)")
    parser.add_argument("dst_dir", type=Path, help="new directory for the checkpoint (must not exist)")
    parser.add_argument("--version", choices=["auto", *VERSIONS], default="auto",
                        help="2: MiniMind2 (Llama-shaped), 3: MiniMind-3 (per-head QK-norm); auto: 3 if the "
                             "weights have q_norm, else 2")
    parser.add_argument("--num_attention_heads", type=positive_int,
                        help="query heads (default: MiniMind2's 8; MiniMind-3 reads it from the shapes)")
    parser.add_argument("--rms_norm_eps", type=non_negative,
                        help="RMSNorm epsilon (default: the version's: MiniMind2 1e-5, MiniMind-3 1e-6)")
    parser.add_argument("--rope_theta", type=non_negative, help="RoPE base (default: 1e6, both versions)")
    parser.add_argument("--max_position_embeddings", type=positive_int,
                        help="context length recorded in the config (default: 32768, both versions)")
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()  # the "Writing model shards" bar beside the one result line
    convert(args.pth, args.tokenizer_dir, args.dst_dir, version=args.version,
            **{name: getattr(args, name) for name in FLAGS})


if __name__ == "__main__":
    run_cli(main)
