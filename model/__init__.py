"""MiniMind model package. Importing it registers the model with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` works on a saved checkpoint."""

from transformers import AutoConfig, AutoModelForCausalLM

from model.model_minimind import (
    ATTN_GATES,
    EMBED_NORMS,
    NORM_GAINS,
    NORM_POSITIONS,
    NORM_SCALINGS,
    NORM_TYPES,
    QK_NORMS,
    V_NORMS,
    MiniMindConfig,
    MiniMindForCausalLM,
    count_norms,
    norm_variant,
)

AutoConfig.register(MiniMindConfig.model_type, MiniMindConfig, exist_ok=True)
AutoModelForCausalLM.register(MiniMindConfig, MiniMindForCausalLM, exist_ok=True)

__all__ = ["ATTN_GATES", "EMBED_NORMS", "NORM_GAINS", "NORM_POSITIONS", "NORM_SCALINGS", "NORM_TYPES", "QK_NORMS", "V_NORMS", "MiniMindConfig",
           "MiniMindForCausalLM", "count_norms", "norm_variant"]
