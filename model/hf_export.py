"""Which MiniMind checkpoints a plain transformers model can represent exactly, and that model's config.

An allowlist, not a best effort: three families compute exactly what a MiniMind model computes, with the same
module names, so the state dict carries over unchanged (parameter-free RMSNorm becomes RMSNorm with gains 1):

    pre     + RMSNorm + no QK-norm        -> LlamaForCausalLM
    pre     + RMSNorm + qk_norm="head"    -> Qwen3ForCausalLM   (per-head q_norm / k_norm before RoPE)
    reorder + RMSNorm + qk_norm="proj"    -> Olmo2ForCausalLM   (norms on the sublayer outputs, whole-projection
                                                                  q_norm / k_norm)
Everything else is refused with the reason, including settings that change the function without adding any
weights (LayerNorm Scaling, DeepNorm's alpha and beta, Mix-LN's Post blocks).
"""

from transformers import LlamaConfig, Olmo2Config, PretrainedConfig, Qwen3Config

from model.model_minimind import NORM_TYPES

FAMILIES = {("pre", "none"): "llama", ("pre", "head"): "qwen3", ("reorder", "proj"): "olmo2"}
CONFIG_CLASSES = {"llama": LlamaConfig, "qwen3": Qwen3Config, "olmo2": Olmo2Config}
ALLOWED = "pre (Llama), pre + qk_norm=head (Qwen3) or reorder + qk_norm=proj (OLMo 2), each with RMSNorm"


def hf_family(cfg) -> str:
    """'llama', 'qwen3' or 'olmo2'; a ValueError with a one-line reason for any other configuration."""
    if not NORM_TYPES[cfg.norm_type].hf_rmsnorm:
        raise ValueError(f"norm_type={cfg.norm_type!r} ({NORM_TYPES[cfg.norm_type].help}): the exportable "
                         f"families normalize with RMSNorm only")
    if cfg.norm_scaling != "none":
        raise ValueError(f"norm_scaling={cfg.norm_scaling!r} scales the norm outputs by 1/sqrt(layer), which no "
                         "Hugging Face family does (it adds no weights to carry it)")
    if getattr(cfg, "v_norm", "none") != "none":
        raise ValueError(f"v_norm={cfg.v_norm!r} normalizes v per head, which Llama, Qwen3 and OLMo 2 do not do "
                         f"(Gemma 3n/4 do, with other changes not matched here); exportable: {ALLOWED}")
    if getattr(cfg, "attn_gate", "none") != "none" or getattr(cfg, "attn_sinks", False):
        raise ValueError("attn_gate and attn_sinks change attention in ways Llama, Qwen3 and OLMo 2 do not (Qwen3-Next "
                         f"gates and GPT-OSS has sinks, with other changes not matched here); exportable: {ALLOWED}")
    family = FAMILIES.get((cfg.norm_position, cfg.qk_norm))
    if family is None:
        raise ValueError(f"norm_position={cfg.norm_position!r} with qk_norm={cfg.qk_norm!r} has no Hugging Face "
                         f"equivalent; exportable: {ALLOWED}")
    return family


def hf_config(cfg, family: str | None = None) -> PretrainedConfig:
    """The config of the transformers model that computes exactly what a MiniMind model of config cfg does."""
    family = family or hf_family(cfg)
    extra = {"head_dim": cfg.head_dim, "use_sliding_window": False} if family == "qwen3" else {}
    config = CONFIG_CLASSES[family](
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
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
        **extra,
    )
    # transformers 5 keeps theta inside rope_parameters only; 4.x reads a top-level rope_theta and, without one,
    # silently uses its default 10000. Set as an attribute, it is written beside rope_parameters for both.
    config.rope_theta = cfg.rope_theta
    return config
