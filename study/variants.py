"""The variant catalogue the ablation runner offers by name: each placement crossed with every norm type
("<placement>-<norm>"), plus setups named whole. What a name means is model/names.py's (variant_fields)."""

from model.model_minimind import NORM_POSITIONS
from model.names import RECIPES, VARIANT_DEFAULTS, variant_fields, variant_problem
from model.norms import NORM_TYPES

__all__ = ["NAMED", "PLACEMENTS", "PLACEMENT_DEFAULTS", "VARIANTS", "variant_fields", "variant_problem"]

PLACEMENTS = [position for position in NORM_POSITIONS if position != "rezero"] + [
    "pre+depth", "mix+depth",  # LayerNorm Scaling ("The Curse of Depth")
    "pre+qk_head", "pre+qk_proj",  # Qwen3; over the whole projection
    "peri+qk_head", "reorder+qk_proj",  # Gemma 3; OLMo 2
    "pre+qkv", "peri+qkv",  # QKV-norm; Gemma 3n/4's norm positions
    "pre+sub", "pre+embed_scale", "pre+embed_norm",  # BitNet's Sub-LN; Gemma's scale; BLOOM
    # Gemma 2; Gemma 3
    "pre+one_plus_w", "peri+embed_scale+one_plus_w", "peri+qk_head+embed_scale+one_plus_w",
]
# Setups named whole, not crossed with every norm type: ReZero has no norm (the trainer's --norm is unused:
# "none" says so), and the recipes of model/names.py.
NAMED = ["rezero", *RECIPES]
# The fields a variant sets besides its norm type, each a trainer flag of the same name, with their defaults.
PLACEMENT_DEFAULTS = {field: value for field, value in VARIANT_DEFAULTS.items() if field != "norm_type"}
# The catalogue ('all'): every placement with every norm type, and the setups named whole.
VARIANTS = [f"{placement}-{norm}" for placement in PLACEMENTS for norm in sorted(NORM_TYPES)] + NAMED

