"""MiniMind: a small Llama-style decoder (RoPE, GQA, SwiGLU), with its norms as data.

Top to bottom: the norm plan,
the config (SWITCHES declares every architecture switch once),
one block for every plan, attention, SwiGLU, RoPE, the model;
the norm types are in model/norms.py.
docs/model.md has the tables: placements, formulas, module names, norm counts.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from model.norms import NORM_TYPES, RMSNorm, count_norms, init_norm, make_norm

# the default norm and the count users check (17 at 8 layers),
# importable from this file as from model/norms.py
__all__ = ["RMSNorm", "count_norms"]


# --------------------------------------------------------------------------------------
# The norm plan: where each block normalizes, as data.
# Each sublayer F (attention, MLP) has three slots,
# each the module name of a norm or None.


@dataclass(frozen=True)
class Slots:
    before: str | None = None  # x + F(N(x))
    after: str | None = None  # x + N(F(x))
    around: str | None = None  # N(x + F(x))


# The module names are Hugging Face's (Llama's for pre, Gemma 2's for peri, OLMo 2's for
# reorder), so that those export one to one: in Llama, post_attention_layernorm is the
# norm *before* the MLP, after attention.
PRE = (Slots(before="input_layernorm"), Slots(before="post_attention_layernorm"))
POST = (Slots(around="post_attention_layernorm"),
        Slots(around="post_feedforward_layernorm"))
PERI = (Slots(before="input_layernorm", after="post_attention_layernorm"),
        Slots(before="pre_feedforward_layernorm", after="post_feedforward_layernorm"))
REORDER = (Slots(after="post_attention_layernorm"),
           Slots(after="post_feedforward_layernorm"))
# HybridNorm: Post-Norm around attention
# (whose q, k and v carry their own norms), none at the MLP
HYBRID = (Slots(around="post_attention_layernorm"), Slots())
# ReZero: no norm, a learnable scale on each sublayer's output
EMPTY = (Slots(), Slots())


def num_post_blocks(config) -> int:
    """Mix-LN's Post-Norm blocks come first: floor(fraction * L)
    (+1e-9: 0.29 * 100 is 28.99..)."""
    return math.floor(config.mix_ln_fraction * config.num_hidden_layers + 1e-9)


# norm_position -> (the slots of block i, whether a final norm follows the last block).
# A final norm is kept wherever the last block
# may leave the residual stream un-normalized;
# after a Post block it would only rescale what that block's norm produced,
# and ReZero has no norm by design. (Mix-LN keeps it even at --mix_ln_fraction 1,
# where every block is Post.)
PLACEMENTS: dict[str, tuple[Callable, bool]] = {
    "pre": (lambda i, cfg: PRE, True),  # Llama, Qwen3
    "post": (lambda i, cfg: POST, False),  # the 2017 Transformer
    "peri": (lambda i, cfg: PERI, True),  # Gemma 2/3's sandwich
    "reorder": (lambda i, cfg: REORDER, True),  # OLMo 2
    "deepnorm": (lambda i, cfg: POST, False),  # DeepNet: POST, scaled skip and init
    "mix": (lambda i, cfg: POST if i < num_post_blocks(cfg) else PRE, True),  # Mix-LN
    "hybrid": (lambda i, cfg: HYBRID, True),  # HybridNorm
    "hybrid_star": (lambda i, cfg: PRE if i == 0 else HYBRID, True),  # HybridNorm*
    "rezero": (lambda i, cfg: EMPTY, False),  # ReZero / SkipInit
}
NORM_POSITIONS = tuple(PLACEMENTS)
# q, k and v normalized in place of an input norm
QKV_PLACEMENTS = ("hybrid", "hybrid_star")


@dataclass(frozen=True)
class LayerPlan:
    attn: Slots
    mlp: Slots
    skip_scale: float = 1.0  # DeepNorm's alpha: N(alpha * x + F(x))
    # LayerNorm Scaling's 1/sqrt(l) on the 'before' norms' outputs
    input_scale: float = 1.0
    # DeepNorm's beta on the initial v_proj, o_proj and MLP weights
    init_scale: float = 1.0
    residual_scale: bool = False  # ReZero's x + a * F(x), one learnable a per sublayer


def layer_plans(config) -> list[LayerPlan]:
    """One plan per block; with has_final_norm, the only reader of PLACEMENTS."""
    L = config.num_hidden_layers
    position = config.norm_position
    alpha = beta = 1.0
    # DeepNet (2022), decoder-only: alpha (2L)^(1/4), beta (8L)^(-1/4)
    if position == "deepnorm":
        alpha = config.deepnorm_alpha or (2 * L) ** 0.25
        beta = config.deepnorm_beta or (8 * L) ** -0.25
    slots_of = PLACEMENTS[position][0]
    return [
        LayerPlan(
            *slots_of(i, config), skip_scale=alpha, init_scale=beta,
            residual_scale=position == "rezero",
            input_scale=1 / math.sqrt(i + 1) if config.norm_scaling == "depth" else 1.0,
        )
        for i in range(L)
    ]


def has_final_norm(config) -> bool:
    return PLACEMENTS[config.norm_position][1]


# --------------------------------------------------------------------------------------
# Config: every architecture switch declared once.


@dataclass(frozen=True)
class Switch:
    """One architecture switch, declared once and used four ways: a config field
    (`name`); a trainer flag (`--name`, or `--flag` where they differ); a row of
    docs/model.md's switch table; and, through `token`, a part of the run's variant
    name (e.g. pre+qk_head-rmsnorm, built in model/names.py)."""

    name: str
    # None: derived from other fields (the placement, the width) unless set
    default: object
    help: str
    type: type = str
    choices: tuple = ()  # the allowed values; a number is checked by `allowed` instead
    # (test, what it asks for, in words)
    allowed: tuple[Callable[[float], bool], str] | None = None
    # value -> part of the variant name; for a number, the prefix of "{prefix}{v:g}"
    token: dict | str | None = None
    flag: str | None = None

    @property
    def flag_name(self) -> str:
        return self.flag or self.name


POSITIVE_INT = (lambda v: v >= 1, "a positive integer")
ABOVE_ZERO = (lambda v: v > 0, "> 0")
SWITCHES = (  # one help line each; docs/model.md has the full table
    Switch("hidden_size", 512, "model width", int, allowed=POSITIVE_INT),
    Switch("intermediate_size", None,
           "SwiGLU width (default: 8/3 x hidden_size, rounded up to 64)",
           int, allowed=POSITIVE_INT),
    Switch("num_hidden_layers", 8, "transformer blocks", int, allowed=POSITIVE_INT),
    Switch("num_attention_heads", 8, "query heads", int, allowed=POSITIVE_INT),
    Switch("num_key_value_heads", 2, "key/value heads (grouped-query attention)",
           int, allowed=POSITIVE_INT),
    Switch("rms_norm_eps", 1e-5, "epsilon of every norm with statistics",
           float, allowed=ABOVE_ZERO),
    Switch("norm_type", "rmsnorm", "the norm in every slot (docs/model.md's table)",
           choices=tuple(NORM_TYPES), flag="norm"),
    Switch("norm_position", "pre", "where the norms sit in each block (README's table)",
           choices=NORM_POSITIONS),
    Switch("mix_ln_fraction", 0.25,
           "Mix-LN: the share of the blocks, from the input, that are Post-Norm "
           "(rounded down: none below 4 layers at 0.25)",
           float, allowed=(lambda v: 0 <= v <= 1, "in [0, 1]")),
    Switch("norm_scaling", "none",
           "depth: block l's input norms times 1/sqrt(l) (LayerNorm Scaling)",
           choices=("none", "depth"), token={"depth": "depth"}),
    Switch("qk_norm", None,
           "normalize q and k per head (Qwen3) or over the projection (OLMo 2) "
           "(default: head for hybrid placements, else none)",
           choices=("none", "head", "proj"),
           token={"head": "qk_head", "proj": "qk_proj"}),
    Switch("v_norm", None,
           "head: normalize each head's values too (Gemma 3n/4) "
           "(default: head for hybrid placements, else none)",
           choices=("none", "head"), token={"head": "v_head"}),
    Switch("sub_norm", False, "norms before o_proj and down_proj (BitNet's Sub-LN)",
           bool, token={True: "sub"}),
    Switch("embed_norm", "none",
           "after the embedding: scale by sqrt(hidden_size) (Gemma), or norm (BLOOM)",
           choices=("none", "scale", "norm"),
           token={"scale": "embed_scale", "norm": "embed_norm"}),
    Switch("norm_gain", "w",
           "one_plus_w: gains stored as w from 0, applied as 1 + w (Gemma 2/3)",
           choices=("w", "one_plus_w"), token={"one_plus_w": "one_plus_w"}),
    Switch("logit_softcap", 0.0,
           "logits C * tanh(z / C) in float32 (Gemma 2: 30, nanochat: 15); 0 = off",
           float, allowed=(lambda v: 0 <= v < math.inf, "a finite number >= 0"),
           token="softcap"),
    Switch("dyt_alpha_init", 0.5, "DyT/Derf: every such norm's starting alpha",
           float, allowed=ABOVE_ZERO),
    Switch("deepnorm_alpha", None, "DeepNorm's skip scale (default: (2L)^(1/4))",
           float, allowed=ABOVE_ZERO),
    Switch("deepnorm_beta", None, "DeepNorm's init scale (default: (8L)^(-1/4))",
           float, allowed=ABOVE_ZERO),
)
SWITCH = {s.name: s for s in SWITCHES}


def with_implied(values: dict) -> SimpleNamespace:
    """Every switch's value: the given ones, the defaults,
    and what the placement implies."""
    c = SimpleNamespace(**{s.name: s.default for s in SWITCHES} | values)
    # HybridNorm is defined with q, k and v normalized per head
    for name in ("qk_norm", "v_norm"):
        if getattr(c, name) is None:
            setattr(c, name, "head" if c.norm_position in QKV_PLACEMENTS else "none")
    return c


def without_norms(c: SimpleNamespace) -> list[tuple]:
    """What the blocks' plans do besides placing norms: DeepNorm's skip and init scales,
    ReZero's learnable scale."""
    return [(p.skip_scale, p.init_scale, p.residual_scale) for p in layer_plans(c)]


def norms_added(c: SimpleNamespace) -> list[str]:
    """The switches on in c that add norms of their own, beside the placement's
    (ReZero has norms only where one of these adds them)."""
    return [f for f, on in (("qk_norm", c.qk_norm != "none"),
                            ("v_norm", c.v_norm != "none"),
                            ("sub_norm", c.sub_norm),
                            ("embed_norm", c.embed_norm == "norm")) if on]


def config_problem(c: SimpleNamespace, name: Callable[[str], str] = str,
                   training: bool = False) -> str | None:
    """Why these switch values (with_implied's) make no model, in one line naming each
    field through `name` (the trainer passes its flags' names), or None when they do.
    With `training` (the trainer, the variant names), also refuse a placement that,
    without norms, builds Pre-Norm's model: --norm_position post with --norm none is
    Pre-Norm's model again, and a study must not train one model under two names.
    (Mix-LN at a depth that rounds its Post-Norm blocks to none is Pre-Norm's model
    too, and is kept: a study across depths names the setup, not each depth's model.)
    A checkpoint saved under such a config still loads."""
    for s in SWITCHES:
        value = getattr(c, s.name)
        if s.choices and value not in s.choices:
            return f"{name(s.name)} must be one of {list(s.choices)}, got {value!r}"
        if s.type is bool and not isinstance(value, bool):
            return f"{name(s.name)} must be true or false, got {value!r}"
        if s.allowed and value is not None and not s.allowed[0](value):
            return f"{name(s.name)} must be {s.allowed[1]}, got {value}"
    width = name("hidden_size")
    heads = name("num_attention_heads")
    kv_heads = name("num_key_value_heads")
    if (c.hidden_size % c.num_attention_heads
            or c.hidden_size // c.num_attention_heads % 2):
        return (f"{width} ({c.hidden_size}) must be {heads} ({c.num_attention_heads}) "
                "times an even head size (rotary embeddings rotate pairs)")
    if c.num_attention_heads % c.num_key_value_heads:
        return (f"{heads} ({c.num_attention_heads}) must be a multiple of "
                f"{kv_heads} ({c.num_key_value_heads})")
    if c.norm_scaling != "none" and c.norm_position not in ("pre", "mix"):
        return (f"{name('norm_scaling')} scales Pre-Norm blocks' input norms: "
                f"use {name('norm_position')} pre or mix")
    if c.norm_position in QKV_PLACEMENTS and (c.qk_norm, c.v_norm) != ("head", "head"):
        return (f"{name('norm_position')} {c.norm_position} (HybridNorm) "
                "normalizes q, k and v per head: "
                f"leave {name('qk_norm')} and {name('v_norm')} unset, or head")
    if c.norm_type == "none" and c.norm_position in QKV_PLACEMENTS:
        return (f"{name('norm_position')} {c.norm_position} normalizes q, k and v, "
                f"but {name('norm_type')} is none")
    adding = norms_added(c)
    if adding and c.norm_type == "none":
        return f"{name(adding[0])} adds norms, but {name('norm_type')} is none"
    # a switch that changes nothing would name another variant for the same model
    if training and c.norm_gain != "w" and c.norm_position == "rezero" and not adding:
        return (f"{name('norm_gain')} {c.norm_gain} needs a norm's gain, "
                f"and {name('norm_position')} rezero has no norms")
    if c.norm_gain != "w" and not NORM_TYPES[c.norm_type].gain:
        return (f"{name('norm_gain')} {c.norm_gain} needs a gain, "
                f"which {name('norm_type')} {c.norm_type} has not")
    # a placement that only places norms builds Pre-Norm's model when there are none:
    # refused, so that no study trains (and labels) the same model twice
    if (training and c.norm_type == "none" and c.norm_position != "pre"
            and c.norm_scaling == "none"):
        pre = SimpleNamespace(**vars(c) | {"norm_position": "pre"})
        if without_norms(c) == without_norms(pre):
            return (f"{name('norm_position')} {c.norm_position} with {name('norm_type')} none "
                    f"is the model of {name('norm_position')} pre: use pre")


class MiniMindConfig(PretrainedConfig):
    """Defaults are MiniMind2-small: 512 hidden, 8 layers, 8 query / 2 KV heads,
    vocab 6400 (~25.8M params).
    The architecture is SWITCHES; the rest are the usual Hugging Face fields."""

    model_type = "minimind"

    def __init__(self, vocab_size: int = 6400, max_position_embeddings: int = 32768,
                 rope_theta: float = 1e6, initializer_range: float = 0.02,
                 tie_word_embeddings: bool = True, bos_token_id: int = 1,
                 eos_token_id: int = 0, pad_token_id: int = 0, **kwargs):
        given = {s.name: kwargs.pop(s.name) for s in SWITCHES if s.name in kwargs}
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size}")
        switches = with_implied(given)
        if problem := config_problem(switches):
            raise ValueError(problem)
        values = vars(switches) | dict(vocab_size=vocab_size, rope_theta=rope_theta,
                                       max_position_embeddings=max_position_embeddings,
                                       initializer_range=initializer_range)
        for field, value in values.items():
            setattr(self, field, value)
        # SwiGLU has three matrices instead of two,
        # so 8/3*hidden keeps the FFN's parameter count at 4*hidden's;
        # rounded up to a multiple of 64, matmuls stay aligned (512 -> 1408, MiniMind).
        self.intermediate_size = (self.intermediate_size
                                  or 64 * math.ceil(self.hidden_size * 8 / 3 / 64))
        super().__init__(tie_word_embeddings=tie_word_embeddings,
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         pad_token_id=pad_token_id, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def norm_for(config: MiniMindConfig, dim: int | None = None) -> nn.Module:
    """The norm the config puts in a slot of dim channels (default: the hidden size)."""
    return make_norm(config.norm_type, dim or config.hidden_size,
                     eps=config.rms_norm_eps,
                     one_plus_w=config.norm_gain == "one_plus_w",
                     alpha_init=config.dyt_alpha_init)


# --------------------------------------------------------------------------------------
# One block, for every placement:
# its LayerPlan says which norm slots hold a norm and how to scale.


class MiniMindBlock(nn.Module):
    def __init__(self, config: MiniMindConfig, layer_idx: int, plan: LayerPlan):
        super().__init__()
        self.plan = plan
        self.self_attn = Attention(config, layer_idx, plan.init_scale)
        self.mlp = FeedForward(config, plan.init_scale)
        for slots in (plan.attn, plan.mlp):
            for name in filter(None, (slots.before, slots.after, slots.around)):
                self.add_module(name, norm_for(config))
        # ReZero: one scalar per sublayer, 0 at init (set in _init_weights)
        if plan.residual_scale:
            self.attn_residual_scale = nn.Parameter(torch.zeros(1))
            self.mlp_residual_scale = nn.Parameter(torch.zeros(1))

    def forward(self, x, rope, mask, cache=None) -> torch.Tensor:
        x = self.residual(x, self.plan.attn,
                          lambda h: self.self_attn(h, rope, mask, cache), "attn")
        return self.residual(x, self.plan.mlp, self.mlp, "mlp")

    def residual(self, x: torch.Tensor,
                 slots: Slots, sublayer, site: str) -> torch.Tensor:
        """One residual sublayer with the plan's norms around it:
        x + F(N(x)) leaves the residual path an untouched sum,
        N(x + F(x)) renormalizes every sum; ReZero: x + a * F(x)."""
        h = x
        if slots.before:
            h = getattr(self, slots.before)(h)
            if self.plan.input_scale != 1.0:
                h = h * self.plan.input_scale
        h = sublayer(h)
        if slots.after:
            h = getattr(self, slots.after)(h)
        if self.plan.residual_scale:
            h = getattr(self, f"{site}_residual_scale") * h
        x = x + h if self.plan.skip_scale == 1.0 else self.plan.skip_scale * x + h
        return getattr(self, slots.around)(x) if slots.around else x


# --------------------------------------------------------------------------------------
# Attention: causal, grouped-query (query heads share K/V heads),
# a KV cache for generation.


def attention_mask_for(attention_mask: torch.Tensor | None, q_len: int, past_len: int,
                       device: torch.device) -> torch.Tensor | None:
    """A boolean mask broadcastable to [batch, 1, q, kv], or None when none is needed
    (no padding, and either no cache or one new token). SDPA's is_causal aligns its
    triangle top-left, exact only when q == kv: the caller uses it with no cache, and
    a single new token needs no mask at all (it sees every key)."""
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded and (past_len == 0 or q_len == 1):
        return None
    q_pos = torch.arange(q_len, device=device)[:, None] + past_len
    k_pos = torch.arange(past_len + q_len, device=device)[None, :]
    mask = (k_pos <= q_pos)[None, None]
    if padded:
        # A padded query that sees nothing would give NaN (softmax over no keys);
        # let it see itself.
        mask = ((mask & attention_mask[:, None, None, -k_pos.shape[1] :].bool())
                | (k_pos == q_pos))
    return mask


class Attention(nn.Module):
    def __init__(self, config: MiniMindConfig, layer_idx: int, init_scale: float = 1.0):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(
            config.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(
            config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(
            config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(
            self.n_heads * self.head_dim, config.hidden_size, bias=False)
        # DeepNorm's beta; not q, k
        self.v_proj.init_scale = self.o_proj.init_scale = init_scale
        # QK-norm bounds the attention logits:
        # per head (Qwen3), or over the projection (OLMo 2)
        self.qk_norm_mode = config.qk_norm
        if self.qk_norm_mode != "none":
            per_head = self.qk_norm_mode == "head"
            q_width = self.head_dim if per_head else self.n_heads * self.head_dim
            k_width = self.head_dim if per_head else self.n_kv_heads * self.head_dim
            self.q_norm = norm_for(config, q_width)
            self.k_norm = norm_for(config, k_width)
        # V-norm (Gemma 3n/4, HybridNorm):
        # with q and k normed too, attention ignores input scale
        self.v_norm = (norm_for(config, self.head_dim)
                       if config.v_norm == "head" else None)
        # Sub-LN (BitNet; NormFormer's head-output norm):
        # the joined heads normalized before o_proj
        self.attn_sub_norm = (norm_for(config, config.hidden_size)
                              if config.sub_norm else None)

    def project_qk(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """q [batch, heads, seq, head_dim],
        k [batch, kv_heads, seq, head_dim]; QK-norm, RoPE."""
        bsz, seq, _ = x.shape
        q, k = self.q_proj(x), self.k_proj(x)
        if self.qk_norm_mode == "proj":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(bsz, seq, self.n_heads, self.head_dim)
        k = k.view(bsz, seq, self.n_kv_heads, self.head_dim)
        if self.qk_norm_mode == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return (apply_rotary(q.transpose(1, 2), *rope),
                apply_rotary(k.transpose(1, 2), *rope))

    def forward(self, x, rope, mask, cache: Cache | None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q, k = self.project_qk(x, rope)
        v = self.v_proj(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        if self.v_norm is not None:
            v = self.v_norm(v)
        v = v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and seq > 1,
            enable_gqa=self.n_kv_heads != self.n_heads,
        ).transpose(1, 2)
        y = y.reshape(bsz, seq, -1)
        if self.attn_sub_norm is not None:
            y = self.attn_sub_norm(y)
        return self.o_proj(y)


# --------------------------------------------------------------------------------------
# Feed-forward: SwiGLU (Shazeer 2020), down(silu(gate(x)) * up(x)).


class FeedForward(nn.Module):
    def __init__(self, config: MiniMindConfig, init_scale: float = 1.0):
        super().__init__()
        self.gate_proj = nn.Linear(
            config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(
            config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(
            config.intermediate_size, config.hidden_size, bias=False)
        for proj in (self.gate_proj, self.up_proj, self.down_proj):
            proj.init_scale = init_scale  # DeepNorm's beta
        # Sub-LN (BitNet; NormFormer's FFN norm):
        # the SwiGLU product normalized before down_proj
        self.ffn_sub_norm = (norm_for(config, config.intermediate_size)
                             if config.sub_norm else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(h if self.ffn_sub_norm is None else self.ffn_sub_norm(h))


# --------------------------------------------------------------------------------------
# Rotary position embeddings (RoPE, Su et al. 2021),
# in Llama's rotate-half layout (portable).


class RotaryEmbedding(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.theta = config.rope_theta
        # Not saved with the weights:
        # a pure function of the config (recomputed in _init_weights).
        self.register_buffer("inv_freq", self.compute_inv_freq(), persistent=False)

    def compute_inv_freq(self) -> torch.Tensor:
        return 1.0 / (self.theta ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # [batch, seq, head_dim/2], in fp32
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim] rotated half against half;
    cos/sin [batch, seq, head_dim]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat((-x2, x1), dim=-1) * sin[:, None]


# --------------------------------------------------------------------------------------
# The model


class MiniMindPreTrainedModel(PreTrainedModel):
    config_class = MiniMindConfig
    base_model_prefix = "model"
    _no_split_modules = ["MiniMindBlock"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            # DeepNorm
            std = self.config.initializer_range * getattr(module, "init_scale", 1.0)
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RotaryEmbedding):
            init.copy_(module.inv_freq, module.compute_inv_freq())
        elif isinstance(module, MiniMindBlock) and module.plan.residual_scale:
            init.zeros_(module.attn_residual_scale)
            init.zeros_(module.mlp_residual_scale)
        else:
            init_norm(module)


class MiniMindModel(MiniMindPreTrainedModel):
    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # What the blocks get from the lookup:
        # as is, times sqrt(d) (Gemma), or normalized (BLOOM)
        if config.embed_norm == "norm":
            self.word_embeddings_layernorm = norm_for(config)
        self.layers = nn.ModuleList(MiniMindBlock(config, i, plan)
                                    for i, plan in enumerate(layer_plans(config)))
        self.norm = norm_for(config) if has_final_norm(config) else nn.Identity()
        self.rotary_emb = RotaryEmbedding(config)
        self.post_init()

    # the cache's name before transformers 5.24, taken as Llama takes it (with a warning):
    # dropped into **kwargs, it would restart the cache from the new tokens alone
    @deprecate_kwarg("past_key_values", version="5.40.0", new_name="cache")
    def forward(self, input_ids: torch.LongTensor | None = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None,
                cache: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None,
                use_cache: bool | None = None,
                output_hidden_states: bool | None = None,
                **kwargs) -> BaseModelOutputWithPast:
        if inputs_embeds is not None:
            # taken as looked up (and, for "scale", scaled) already, as in Gemma
            x = inputs_embeds
        else:
            x = self.embed_tokens(input_ids)
            # sqrt(d) in float32, then x's dtype (Gemma)
            if self.config.embed_norm == "scale":
                x = x * torch.tensor(self.config.hidden_size**0.5).to(x.dtype)
        if self.config.embed_norm == "norm":  # on inputs_embeds too, as in BLOOM
            x = self.word_embeddings_layernorm(x)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_len = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(
                past_len, past_len + x.shape[1], device=x.device)[None]
        # cos/sin in the projections' dtype: under autocast bf16, as fp32 tables
        # would promote q and k to fp32 for attention to cast back (a QK-norm's
        # fp32 gain does that anyway); without autocast the stream's (fp32 exact).
        autocast = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
        rope = self.rotary_emb(position_ids, dtype)
        mask = attention_mask_for(attention_mask, x.shape[1], past_len, x.device)

        # hidden_states[i] is the residual stream entering block i;
        # the last is the final output.
        hidden_states = []
        for layer in self.layers:
            if output_hidden_states:
                hidden_states.append(x)
            x = layer(x, rope, mask, cache)
        x = self.norm(x)
        if output_hidden_states:
            hidden_states.append(x)
        return BaseModelOutputWithPast(
            last_hidden_state=x,
            cache=cache if use_cache else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
        )


class MiniMindForCausalLM(MiniMindPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.model = MiniMindModel(config)
        # with tie_word_embeddings (the default), post_init ties it to embed_tokens' weight
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @deprecate_kwarg("past_key_values", version="5.40.0", new_name="cache")  # as above
    def forward(self, input_ids: torch.LongTensor | None = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None,
                cache: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None,
                shift_labels: torch.LongTensor | None = None,
                use_cache: bool | None = None,
                output_hidden_states: bool | None = None,
                logits_to_keep: int = 0,
                **kwargs) -> CausalLMOutputWithPast:
        """labels: Hugging Face style,
        aligned with input_ids and shifted here (-100 = ignore).
        shift_labels: targets already aligned with the logits
        (what the trainer's batches hold)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache,
                         inputs_embeds=inputs_embeds, use_cache=use_cache,
                         output_hidden_states=output_hidden_states)
        # logits of the last logits_to_keep positions (generation needs 1);
        # 0 keeps all, as x[:, -0:] is x[:, 0:]
        logits = self.lm_head(out.last_hidden_state[:, -logits_to_keep:])
        cap = self.config.logit_softcap
        # C * tanh(z / C) in float32 (Gemma 2, nanochat):
        # every logit stays within (-C, C)
        if cap:
            logits = cap * torch.tanh(logits.float() / cap)
        # position t predicts token t+1; the last position has no target
        if labels is not None:
            shift_labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
        loss = None
        # in fp32 even under autocast: a 6400-way log-softmax needs it
        if shift_labels is not None:
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), shift_labels.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache,
                                      hidden_states=out.hidden_states)
