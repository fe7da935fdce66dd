"""Named normalization setups: "<placement>-<norm>" names (pre-rmsnorm, reorder+qk_proj-rmsnorm, ...), plus a few
named whole (rezero, nanochat), and the flags each sets. norm_variant() in model_minimind.py names a config the
same way; the ablation runner and scripts/signal_propagation.py take these names."""

from model.model_minimind import NORM_POSITIONS, NORM_TYPES, QKV_PLACEMENTS, MiniMindConfig

# A placement names the values of the fields that decide where the norms go; fields it leaves out keep these.
PLACEMENT_DEFAULTS = {"norm_position": "pre", "norm_scaling": "none", "qk_norm": "none", "v_norm": "none",
                      "attn_gate": "none", "attn_sinks": False, "sub_norm": False, "embed_norm": "none",
                      "norm_gain": "w", "logit_softcap": 0.0}
QKV = {"qk_norm": "head", "v_norm": "head"}
PLACEMENTS = {position: {"norm_position": position, **(QKV if position in QKV_PLACEMENTS else {})}
              for position in NORM_POSITIONS if position != "rezero"} | {
    "pre+depth": {"norm_scaling": "depth"},  # LayerNorm Scaling ("The Curse of Depth")
    "mix+depth": {"norm_position": "mix", "norm_scaling": "depth"},
    "pre+qk_head": {"qk_norm": "head"},  # Qwen3
    "pre+qk_proj": {"qk_norm": "proj"},
    "peri+qk_head": {"norm_position": "peri", "qk_norm": "head"},  # Gemma 3
    "reorder+qk_proj": {"norm_position": "reorder", "qk_norm": "proj"},  # OLMo 2
    "pre+qkv": {"qk_norm": "head", "v_norm": "head"},  # QKV-norm
    "peri+qkv": {"norm_position": "peri", "qk_norm": "head", "v_norm": "head"},  # Gemma 3n/4's norm positions
    # Not norms, but aimed at what norms shape: attention sinks and massive activations. pre+gate is the
    # elementwise gate, the form that ships (Qwen3-Next); pre+gate_head the headwise one (H gates, not H * head_dim).
    "pre+gate": {"attn_gate": "elementwise"},
    "pre+gate_head": {"attn_gate": "headwise"},
    "pre+sinks": {"attn_sinks": True},  # GPT-OSS, DeepSeek-V4
    "pre+sub": {"sub_norm": True},  # BitNet's Sub-LN
    "pre+embed_scale": {"embed_norm": "scale"},
    "pre+embed_norm": {"embed_norm": "norm"},  # BLOOM
    "pre+one_plus_w": {"norm_gain": "one_plus_w"},
    "peri+embed_scale+one_plus_w": {"norm_position": "peri", "embed_norm": "scale", "norm_gain": "one_plus_w"},  # Gemma 2
    "peri+qk_head+embed_scale+one_plus_w": {"norm_position": "peri", "qk_norm": "head", "embed_norm": "scale",
                                            "norm_gain": "one_plus_w"},  # Gemma 3
}
# "<placement>-<norm>" -> the trainer flags it sets. Names are looked up here, never split on "-".
VARIANTS = {f"{placement}-{norm}": {**PLACEMENT_DEFAULTS, **fields, "norm": norm}
            for placement, fields in PLACEMENTS.items() for norm in sorted(NORM_TYPES)}
# Setups named whole, not crossed with every norm type. ReZero has no norm, so no norm type to pair with (the
# trainer's --norm is then unused: "none" says so). nanochat's norms: parameter-free RMSNorm before each sublayer,
# per head on q and k, after the embedding lookup and before lm_head, with the logits soft-capped at 15
# (model_minimind.RECIPES gives such a model this name).
NAMED = {
    "rezero": {**PLACEMENT_DEFAULTS, "norm_position": "rezero", "norm": "none"},
    "nanochat": {**PLACEMENT_DEFAULTS, "qk_norm": "head", "embed_norm": "norm", "logit_softcap": 15.0,
                 "norm": "rmsnorm_noparam"},
}
VARIANTS |= NAMED


def variant_fields(name: str) -> dict:
    """The variant's model-config fields (its trainer flags, with --norm as the config's norm_type)."""
    return {"norm_type" if flag == "norm" else flag: value for flag, value in VARIANTS[name].items()}


def variant_problem(name: str) -> str | None:
    """Why the variant's fields make no model config, or None when they do. Not every placement pairs with every
    norm: a placement that adds norms (hybrid, pre+qk_head, pre+sub, ...) needs a norm type, and a (1 + w) gain
    needs a norm with a gain."""
    try:
        MiniMindConfig(**variant_fields(name))
    except ValueError as err:
        return str(err)
    return None
