"""The MiniMind -> Llama mapping: which checkpoints Llama can represent, and the equivalent LlamaConfig.

A Pre-Norm RMSNorm MiniMind *is* a Llama (same module names, rotate-half RoPE, SwiGLU, GQA, tied embeddings),
so the state dict carries over unchanged (parameter-free RMSNorm becomes RMSNorm with its gains set to 1);
every other variant computes a function Llama cannot.
"""

from transformers import LlamaConfig

NORM_TYPE_REASONS = {
    "layernorm": "LayerNorm subtracts the mean and has a bias; Llama's RMSNorm has neither",
    "dyt": "DyT (tanh with a learnable scale) is not a normalization Llama has",
    "none": "Llama always normalizes; a model trained without norms would change behaviour",
}


def llama_config(cfg) -> LlamaConfig:
    return LlamaConfig(
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
        mlp_bias=False,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )


def why_not_llama(cfg) -> str | None:
    """None if the config maps exactly onto Llama, else a one-line reason."""
    if cfg.norm_position != "pre":
        return (f"norm_position={cfg.norm_position!r}: Llama normalizes before each sublayer (Pre-Norm); "
                "a Post-Norm model computes a different function")
    if cfg.norm_type not in ("rmsnorm", "rmsnorm_noparam"):  # parameter-free = Llama's RMSNorm with gain 1
        return f"norm_type={cfg.norm_type!r}: {NORM_TYPE_REASONS[cfg.norm_type]}"
    return None
