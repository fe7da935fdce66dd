"""MiniMind: a small Llama-style decoder with switchable normalization.

Read top to bottom: config -> the norms -> rotary embeddings -> attention -> feed-forward -> block -> model.
With the defaults (Pre-Norm, 8 layers) the model holds 17 norms:

    layers.{0..7}.input_layernorm            before attention      (8)
    layers.{0..7}.post_attention_layernorm   before the MLP        (8)   <- Llama's name; it is a *pre*-MLP norm
    norm                                     before lm_head        (1)

With norm_position="post" (the 2017 Transformer), each block instead normalizes *after* each residual add:

    layers.{0..7}.post_attention_layernorm   after attention + residual      (8)
    layers.{0..7}.post_feedforward_layernorm after MLP + residual            (8)

and there is no final norm (16 in all): the last block already ends in a norm, and a second norm straight
after it would only rescale what the first one produced.

Module names follow Hugging Face's modeling_llama.py, so a Pre-RMSNorm checkpoint maps 1:1 onto
LlamaForCausalLM (see scripts/convert_to_llama.py).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from model.rmsnorm_kernels import rms_norm

NORM_POSITIONS = ("pre", "post")


# ----------------------------------------------------------------------------------------------------------
# Config


class MiniMindConfig(PretrainedConfig):
    """Defaults are MiniMind2-small: 512 hidden, 8 layers, 8 query / 2 KV heads, vocab 6400 (~25.8M params)."""

    model_type = "minimind"

    def __init__(
        self,
        vocab_size: int = 6400,
        hidden_size: int = 512,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 8,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 2,
        max_position_embeddings: int = 32768,
        rope_theta: float = 1e6,
        rms_norm_eps: float = 1e-5,
        norm_type: str = "rmsnorm",
        norm_position: str = "pre",
        dyt_alpha_init: float = 0.5,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = True,
        bos_token_id: int = 1,
        eos_token_id: int = 0,
        pad_token_id: int = 0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        # SwiGLU has three matrices instead of two, so 8/3*hidden keeps the FFN's parameter count at 4*hidden's;
        # rounding up to a multiple of 64 keeps matmuls aligned (512 -> 1408, as in MiniMind).
        self.intermediate_size = intermediate_size or 64 * math.ceil(hidden_size * 8 / 3 / 64)
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.norm_type = norm_type
        self.norm_position = norm_position
        self.dyt_alpha_init = dyt_alpha_init
        self.initializer_range = initializer_range
        self._validate()
        super().__init__(
            tie_word_embeddings=tie_word_embeddings,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            **kwargs,
        )

    def _validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); allowed: a divisor of hidden_size"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"hidden_size / num_attention_heads must be even for rotary embeddings, "
                f"got {self.hidden_size // self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_key_value_heads "
                f"({self.num_key_value_heads}); allowed: a divisor of num_attention_heads"
            )
        if self.norm_type not in NORM_TYPES:
            raise ValueError(f"norm_type must be one of {sorted(NORM_TYPES)}, got {self.norm_type!r}")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position must be one of {list(NORM_POSITIONS)}, got {self.norm_position!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# ----------------------------------------------------------------------------------------------------------
# Normalization: every variant the study can switch to, chosen by name from NORM_TYPES below.


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight  (Zhang & Sennrich 2019). No mean subtraction, no bias.

    The statistics are computed in float32 and the result cast back, because mean(x^2) over 512 bf16 values
    loses most of its precision; the weight multiplies the cast-back value, as in Llama, so under autocast
    (bf16 x, float32 weight) the output is float32. elementwise_affine=False gives the parameter-free variant.
    The arithmetic lives in model/rmsnorm_kernels.py: the eager formula
        xf = x.float(); (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    or, with the same output bit for bit, a faster way to run it, chosen by device and dtype from measurement.
    """

    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., CVPR 2025): y = weight * tanh(alpha * x) + bias, with one learnable scalar alpha.

    Not a normalization at all: an elementwise squashing that replaces the norm. alpha starts at
    dyt_alpha_init (0.5, the paper's default), weight at 1 and bias at 0.
    """

    def __init__(self, dim: int, alpha_init: float = 0.5):
        super().__init__()
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


# name -> constructor(hidden_size, config). "none" keeps the module slots (as Identity) so the block code
# stays the same for every variant.
NORM_TYPES = {
    "rmsnorm": lambda dim, cfg: RMSNorm(dim, cfg.rms_norm_eps),
    "rmsnorm_noparam": lambda dim, cfg: RMSNorm(dim, cfg.rms_norm_eps, elementwise_affine=False),
    "layernorm": lambda dim, cfg: nn.LayerNorm(dim, eps=cfg.rms_norm_eps, bias=True),  # GPT-2 style
    "dyt": lambda dim, cfg: DyT(dim, cfg.dyt_alpha_init),
    "none": lambda dim, cfg: nn.Identity(),
}
NORM_MODULES = (RMSNorm, nn.LayerNorm, DyT)


def make_norm(config: MiniMindConfig) -> nn.Module:
    return NORM_TYPES[config.norm_type](config.hidden_size, config)


def count_norms(model: nn.Module) -> int:
    """Number of normalization modules (Identity placeholders of norm_type='none' do not count)."""
    return sum(isinstance(m, NORM_MODULES) for m in model.modules())


# ----------------------------------------------------------------------------------------------------------
# Rotary position embeddings (RoPE, Su et al. 2021), in Llama's rotate-half layout so weights stay portable.


class RotaryEmbedding(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.theta = config.rope_theta
        # Not saved with the weights: it is a pure function of the config (recomputed in _init_weights).
        self.register_buffer("inv_freq", self.compute_inv_freq(), persistent=False)

    def compute_inv_freq(self) -> torch.Tensor:
        return 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq  # [batch, seq, head_dim/2], in fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, seq, head_dim]; cos/sin: [batch, seq, head_dim] -> broadcast over heads
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


# ----------------------------------------------------------------------------------------------------------
# Attention: causal, grouped-query (several query heads share one K/V head), with a KV cache for generation.


def attention_mask_for(
    attention_mask: torch.Tensor | None, q_len: int, past_len: int, device: torch.device
) -> torch.Tensor | None:
    """Boolean [batch, 1, q, kv] mask, or None when SDPA's own causal fast path is exact.

    The fast path (is_causal) aligns the triangle to the top-left, which is only right with no cache or a single
    new token; padding (attention_mask zeros) also needs an explicit mask.
    """
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded and (past_len == 0 or q_len == 1):
        return None
    q_pos = torch.arange(q_len, device=device)[:, None] + past_len
    k_pos = torch.arange(past_len + q_len, device=device)[None, :]
    mask = (k_pos <= q_pos)[None, None]
    if padded:
        # A padded query that sees nothing would give NaN (softmax over no keys); let it see itself.
        mask = (mask & attention_mask[:, None, None, -k_pos.shape[1] :].bool()) | (k_pos == q_pos)
    return mask


class Attention(nn.Module):
    def __init__(self, config: MiniMindConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x, rope, mask, past_key_values: Cache | None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.q_proj(x).view(bsz, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and seq > 1, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.o_proj(y.transpose(1, 2).reshape(bsz, seq, -1))


# ----------------------------------------------------------------------------------------------------------
# Feed-forward: SwiGLU (Shazeer 2020), down(silu(gate(x)) * up(x)).


class FeedForward(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------------------------------------
# One block. The only place where norm_position matters.


class MiniMindBlock(nn.Module):
    def __init__(self, config: MiniMindConfig, layer_idx: int):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.self_attn = Attention(config, layer_idx)
        self.mlp = FeedForward(config)
        if self.pre_norm:
            self.input_layernorm = make_norm(config)
            self.post_attention_layernorm = make_norm(config)
        else:
            self.post_attention_layernorm = make_norm(config)
            self.post_feedforward_layernorm = make_norm(config)

    def forward(self, x, rope, mask, past_key_values=None) -> torch.Tensor:
        if self.pre_norm:
            # x + F(Norm(x)): the residual path is an untouched sum from the embeddings to the last layer.
            x = x + self.self_attn(self.input_layernorm(x), rope, mask, past_key_values)
            return x + self.mlp(self.post_attention_layernorm(x))
        # Norm(x + F(x)): every residual add is renormalized, so the residual path passes through 2L norms.
        x = self.post_attention_layernorm(x + self.self_attn(x, rope, mask, past_key_values))
        return self.post_feedforward_layernorm(x + self.mlp(x))


# ----------------------------------------------------------------------------------------------------------
# The model


class MiniMindPreTrainedModel(PreTrainedModel):
    config_class = MiniMindConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["MiniMindBlock"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, NORM_MODULES):
            if module.weight is not None:
                init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
            if isinstance(module, DyT):
                init.constant_(module.alpha, module.alpha_init)
        elif isinstance(module, RotaryEmbedding):
            init.copy_(module.inv_freq, module.compute_inv_freq())


class MiniMindModel(MiniMindPreTrainedModel):
    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MiniMindBlock(config, i) for i in range(config.num_hidden_layers))
        # Pre-Norm leaves the residual stream un-normalized, so it needs one last norm before lm_head.
        self.norm = make_norm(config) if config.norm_position == "pre" else nn.Identity()
        self.rotary_emb = RotaryEmbedding(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + x.shape[1], device=x.device)[None]
        rope = self.rotary_emb(position_ids, x.dtype)
        mask = attention_mask_for(attention_mask, x.shape[1], past_len, x.device)

        # hidden_states[i] is the residual stream entering block i; the last entry is the final output.
        hidden_states = []
        for layer in self.layers:
            if output_hidden_states:
                hidden_states.append(x)
            x = layer(x, rope, mask, past_key_values)
        x = self.norm(x)
        if output_hidden_states:
            hidden_states.append(x)
        return BaseModelOutputWithPast(
            last_hidden_state=x,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
        )


class MiniMindForCausalLM(MiniMindPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.model = MiniMindModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        shift_labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """labels: Hugging Face style, aligned with input_ids and shifted here (-100 = ignore).
        shift_labels: targets already aligned with the logits (what the trainer's batches hold)."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )
        hidden = out.last_hidden_state if logits_to_keep == 0 else out.last_hidden_state[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        if labels is not None:  # position t predicts token t+1; the last position has no target
            shift_labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
        loss = None
        if shift_labels is not None:  # in fp32 even under autocast: a 6400-way log-softmax needs it
            loss = F.cross_entropy(logits.float().flatten(0, 1), shift_labels.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, past_key_values=out.past_key_values, hidden_states=out.hidden_states
        )
