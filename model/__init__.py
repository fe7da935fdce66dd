"""MiniMind model package.
Importing it registers the model with transformers' Auto classes,
so `AutoModelForCausalLM.from_pretrained(dir)` works on a saved checkpoint."""

from transformers import AutoConfig, AutoModelForCausalLM

from model.model_minimind import (
    NORM_POSITIONS,
    SWITCH,
    SWITCHES,
    MiniMindConfig,
    MiniMindForCausalLM,
)
from model.names import PRESETS, norm_variant, variant_fields, variant_problem
from model.norms import NORM_TYPES, count_norms

AutoConfig.register(MiniMindConfig.model_type, MiniMindConfig, exist_ok=True)
AutoModelForCausalLM.register(MiniMindConfig, MiniMindForCausalLM, exist_ok=True)

__all__ = ["NORM_POSITIONS", "NORM_TYPES", "PRESETS", "SWITCH", "SWITCHES",
           "MiniMindConfig", "MiniMindForCausalLM", "count_norms",
           "norm_variant", "variant_fields", "variant_problem"]
