"""Which MiniMind checkpoints a plain transformers model computes exactly, and that model's config.

An allowlist, not a best effort (the table: docs/model.md): Llama, Qwen3 and OLMo 2 compute the same function
with the same module names, so the state dict carries over unchanged (parameter-free RMSNorm becomes gains of
1), and Gemma 2/3 configs are set to compute it. Everything else is refused with the reason, including
settings that change the function without adding weights (LayerNorm Scaling, DeepNorm, Mix-LN, soft-capping).
"""

from transformers import (
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    Olmo2Config,
    PretrainedConfig,
    Qwen3Config,
)

from model.norms import NORM_TYPES

# (norm_position, qk_norm, norm_gain, embed_norm) -> family
FAMILIES = {("pre", "none", "w", "none"): "llama", ("pre", "head", "w", "none"): "qwen3",
            ("reorder", "proj", "w", "none"): "olmo2", ("peri", "none", "one_plus_w", "scale"): "gemma2",
            ("peri", "head", "one_plus_w", "scale"): "gemma3"}
CONFIG_CLASSES = {"llama": LlamaConfig, "qwen3": Qwen3Config, "olmo2": Olmo2Config, "gemma2": Gemma2Config,
                  "gemma3": Gemma3TextConfig}
ALLOWED = ("pre (Llama), pre + qk_norm=head (Qwen3) or reorder + qk_norm=proj (OLMo 2), each with RMSNorm; "
           "to Hugging Face only, not GGUF: peri + norm_gain=one_plus_w + embed_norm=scale (Gemma 2), and "
           "with qk_norm=head (Gemma 3), with rmsnorm")


def hf_family(cfg) -> str:
    """'llama', 'qwen3', 'olmo2', 'gemma2' or 'gemma3'; a ValueError with a one-line reason for all else."""
    if cfg.norm_position == "rezero":
        raise ValueError("norm_position='rezero' scales each sublayer's output by a learnable scalar and has "
                         f"no norms, which no Hugging Face family does; exportable: {ALLOWED}")
    if not NORM_TYPES[cfg.norm_type].hf_rmsnorm:
        raise ValueError(f"norm_type={cfg.norm_type!r} ({NORM_TYPES[cfg.norm_type].help}): the exportable "
                         f"families normalize with RMSNorm only; exportable: {ALLOWED}")
    if cfg.norm_scaling != "none":
        raise ValueError(f"norm_scaling={cfg.norm_scaling!r} scales the norm outputs by 1/sqrt(layer), which "
                         "no Hugging Face family does (it adds no weights to carry it); "
                         f"exportable: {ALLOWED}")
    if cfg.v_norm != "none":
        raise ValueError(f"v_norm={cfg.v_norm!r} normalizes v per head, which Llama, Qwen3, OLMo 2 and Gemma "
                         "2/3 do not do (Gemma 3n/4 do, with other changes not matched here); "
                         f"exportable: {ALLOWED}")
    if cfg.sub_norm:
        raise ValueError("sub_norm=True adds attn_sub_norm and ffn_sub_norm, which only BitNet has, and "
                         f"BitNet's ternary weights are not matched here; exportable: {ALLOWED}")
    if cfg.embed_norm == "norm":
        raise ValueError("embed_norm='norm' normalizes the embeddings (BLOOM: LayerNorm, ALiBi, no gated "
                         f"MLP), which no exportable family does; exportable: {ALLOWED}")
    key = (cfg.norm_position, cfg.qk_norm, cfg.norm_gain, cfg.embed_norm)
    family = FAMILIES.get(key)
    if family is None:
        raise ValueError(f"norm_position={key[0]!r} with qk_norm={key[1]!r}, norm_gain={key[2]!r} and "
                         f"embed_norm={key[3]!r} has no Hugging Face equivalent; exportable: {ALLOWED}")
    if family.startswith("gemma") and cfg.norm_type != "rmsnorm":
        raise ValueError(f"norm_type={cfg.norm_type!r}: Gemma's norms have (1 + w) gains; "
                         f"exportable: {ALLOWED}")
    if cfg.logit_softcap and not family.startswith("gemma"):
        raise ValueError(f"logit_softcap={cfg.logit_softcap:g} soft-caps the logits, which {family} does not "
                         "do (of the exportable families only Gemma 2/3 do); train without --logit_softcap, "
                         f"or in a Gemma shape; exportable: {ALLOWED}")
    return family


# The fields a MiniMind config and the transformers config name alike
SHARED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
          "bos_token_id", "eos_token_id", "pad_token_id")


def hf_config(cfg, family: str | None = None) -> PretrainedConfig:
    """The config of the transformers model that computes exactly what a MiniMind model of config cfg does."""
    family = family or hf_family(cfg)
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    extra = {"hidden_act": "silu", "rope_parameters": rope}
    if family == "qwen3":
        extra |= {"head_dim": cfg.head_dim, "use_sliding_window": False}
    if family.startswith("gemma"):  # what makes Gemma compute this model rather than Gemma's own recipe
        extra = {
            "head_dim": cfg.head_dim,
            "hidden_activation": "silu",
            "query_pre_attn_scalar": cfg.head_dim,  # scale 1/sqrt(head_dim)
            "layer_types": ["full_attention"] * cfg.num_hidden_layers,
            # No layer slides, but the model still builds a sliding mask: a window as long as the context
            "sliding_window": cfg.max_position_embeddings,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": cfg.logit_softcap or None,
            # Gemma 3 keeps one RoPE per layer type; only full_attention is used, the other is set alike
            "rope_parameters": rope if family == "gemma2" else {"full_attention": rope,
                                                                "sliding_attention": dict(rope)},
        }
    config = CONFIG_CLASSES[family](**{field: getattr(cfg, field) for field in SHARED}, attention_bias=False,
                                    **extra)
    # transformers 5 keeps theta inside rope_parameters only; 4.x reads a top-level rope_theta and, without
    # one, silently uses its default 10000. Set as an attribute, it is written beside rope_parameters.
    config.rope_theta = cfg.rope_theta
    return config
