"""MiniMind: a small Llama-style decoder whose normalization is data, not code.

Read top to bottom: config -> the norms -> the norm plan -> rotary embeddings -> attention -> feed-forward ->
block -> model. With the defaults (Pre-Norm RMSNorm, 8 layers) the model holds 17 norms:

    layers.{0..7}.input_layernorm            before attention      (8)
    layers.{0..7}.post_attention_layernorm   before the MLP        (8)   <- Llama's name; it is a *pre*-MLP norm
    norm                                     before lm_head        (1)

Where the norms sit is decided by `norm_position`, turned by layer_plans() into one small LayerPlan per block
(which norm slots exist, a scale on the skip, a scale on the input norms); one block class runs every plan.
Each sublayer F (attention, MLP) has three slots: before F (x + F(N(x))), on F's output before the add
(x + N(F(x))) and on the sum (N(x + F(x))). Module names follow the Hugging Face family that uses each
placement, so one name can mean different things in different placements:

  placement  block formula (per sublayer F)  norms per block, in order                              final  at L=8
  pre        x + F(N(x))                     input_layernorm (attn in), post_attention_layernorm    yes    17
                                             (MLP in)                                   [Llama, Qwen3]
  post       N(x + F(x))                     post_attention_layernorm (after attn add),              no     16
                                             post_feedforward_layernorm (after MLP add)   [2017]
  peri       x + N_out(F(N_in(x)))           input_layernorm (attn in), post_attention_layernorm     yes    33
                                             (attn out), pre_feedforward_layernorm (MLP in),
                                             post_feedforward_layernorm (MLP out)        [Gemma 2/3]
  reorder    x + N(F(x))                     post_attention_layernorm (attn out),                   yes    17
                                             post_feedforward_layernorm (MLP out)        [OLMo 2]
  deepnorm   N(alpha * x + F(x))             as post; alpha = (2L)^(1/4), and v_proj, o_proj and     no     16
                                             the MLP start at beta = (8L)^(-1/4) times the usual init
  mix        post in blocks < floor(f * L),  post's names in the Post blocks, pre's in the others   yes    17
             pre in the rest (Mix-LN)        (f = mix_ln_fraction = 0.25: 2 Post blocks at L=8)
  hybrid     N(x + Attn(x)), then h + FFN(h) post_attention_layernorm (after attn add),             yes    33
             (HybridNorm; q, k, v are taken  self_attn.q_norm / k_norm / v_norm; no MLP norm
             from the raw stream, normalized) (implies qk_norm="head" and v_norm="head")
  hybrid_star  block 0 pre + QKV-norm,       block 0: pre's names and q/k/v norms;                  yes    34
             the rest hybrid (HybridNorm*)   the others as hybrid
  rezero     x + a * F(x), a a learnable     none; attn_residual_scale and mlp_residual_scale,       no     0
             scalar per sublayer, 0 at init  one scalar each (ReZero, SkipInit): every block is the
                                             identity at init

A final norm is kept wherever the last block leaves the residual stream un-normalized; after a Post block it
would only rescale what that block's norm produced. Two switches work with every placement:
  qk_norm="head"  self_attn.q_norm / k_norm over each head's head_dim, before RoPE (Qwen3, Gemma 3): +2 per block
  qk_norm="proj"  the same over the whole q / k projections, before the head split (OLMo 2):       +2 per block
plus v_norm="head": self_attn.v_norm over each head's v, before attention (Gemma 3n/4 QKV-norm): +1 per block;
and norm_scaling="depth" (LayerNorm Scaling) multiplies the input norms of block l = 1..L by 1/sqrt(l) (pre and
mix only; no extra norms). Also with every placement:
  sub_norm=True       self_attn.attn_sub_norm on the concatenated heads before o_proj (width heads * head_dim) and
                      mlp.ffn_sub_norm on the SwiGLU product before down_proj (width intermediate_size), BitNet's
                      names (Sub-LN, NormFormer's inner norms):                                  +2 per block
  embed_norm="scale"  the looked-up embeddings times sqrt(hidden_size) (Gemma):                   no extra norm
  embed_norm="norm"   model.word_embeddings_layernorm right after the lookup (BLOOM):             +1
  norm_gain="one_plus_w"  every gain stored as w (init 0) and applied as 1 + w in float32 (Gemma 2/3); the
                      same function at init, but weight decay (--norm_weight_decay) pulls it toward 1, not 0
Two attention options are not norms and add none (count_norms is unchanged), but target what norms shape, attention
sinks and massive activations; they too work with every placement:
  attn_gate="elementwise"|"headwise"  y_h * sigmoid(gate_h) on each head's output before o_proj, the gate logits
                                      computed by q_proj (per head: the query, then head_dim or 1 gate logits;
                                      Qwen3-Next's layout)                                     +0 norms
  attn_sinks=True                     self_attn.sinks, one learnable logit per head in every softmax row
                                      (GPT-OSS, DeepSeek-V4)                                   +0 norms
norm_type (RMSNorm, LayerNorm, DyT, Derf, SeeDNorm, BatchNorm, none) is independent of all of this. One more option
is not a norm but bounds what the norms feed: logit_softcap=C turns the logits z into C * tanh(z / C), in float32
(Gemma 2, nanochat), in training and generation alike.

Pre-Norm RMSNorm maps 1:1 onto LlamaForCausalLM, with head QK-norm onto Qwen3ForCausalLM, and reorder with proj
QK-norm onto Olmo2ForCausalLM; peri RMSNorm with one_plus_w gains and the sqrt(d) embedding scale onto
Gemma2ForCausalLM, with head QK-norm onto Gemma3ForCausalLM (scripts/convert_to_hf.py).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from model.norms import BatchNorm, Derf, DyT, LayerNorm, SeeDNorm, SSNorm, gain_of
from model.rmsnorm_kernels import rms_norm

# transformers 5.24 renamed the KV cache from past_key_values to cache, both in what generate() passes to forward
# and in the model outputs it reads back. The model takes either name and returns the cache under the name the
# installed release reads, so generation keeps its context on every release requirements.txt admits.
CACHE_FIELD = "cache" if "cache" in {f.name for f in fields(CausalLMOutputWithPast)} else "past_key_values"

NORM_POSITIONS = ("pre", "post", "peri", "reorder", "deepnorm", "mix", "hybrid", "hybrid_star", "rezero")
# HybridNorm normalizes q, k and v inside attention in place of an input norm: these placements need both fields.
QKV_PLACEMENTS = ("hybrid", "hybrid_star")
NORM_SCALINGS = ("none", "depth")
QK_NORMS = ("none", "head", "proj")
V_NORMS = ("none", "head")
ATTN_GATES = ("none", "headwise", "elementwise")
EMBED_NORMS = ("none", "scale", "norm")
NORM_GAINS = ("w", "one_plus_w")


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
        mix_ln_fraction: float = 0.25,
        norm_scaling: str = "none",
        qk_norm: str | None = None,
        v_norm: str | None = None,
        attn_gate: str = "none",
        attn_sinks: bool = False,
        sub_norm: bool = False,
        embed_norm: str = "none",
        norm_gain: str = "w",
        deepnorm_alpha: float | None = None,
        deepnorm_beta: float | None = None,
        dyt_alpha_init: float = 0.5,
        dyt_alpha_init_attn: float | None = None,
        dyt_alpha_init_mlp: float | None = None,
        dyt_alpha_init_final: float | None = None,
        logit_softcap: float = 0.0,
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
        self.mix_ln_fraction = mix_ln_fraction
        self.norm_scaling = norm_scaling
        # Unset, they follow the placement: HybridNorm is defined with q, k and v normalized per head, the rest
        # with neither. An explicit value that contradicts the placement is refused in _validate.
        implied = "head" if norm_position in QKV_PLACEMENTS else "none"
        self.qk_norm = implied if qk_norm is None else qk_norm
        self.v_norm = implied if v_norm is None else v_norm
        self.attn_gate = attn_gate
        self.attn_sinks = attn_sinks
        self.sub_norm = sub_norm
        self.embed_norm = embed_norm
        self.norm_gain = norm_gain
        # DeepNet's decoder-only constants unless set (setting both to 1 turns deepnorm into post, a test uses it)
        self.deepnorm_alpha = deepnorm_alpha
        self.deepnorm_beta = deepnorm_beta
        # DyT's LLaMA recipe starts alpha differently before attention, before the MLP and in the final norm;
        # an unset position falls back to dyt_alpha_init (also used by the QK-norms).
        self.dyt_alpha_init = dyt_alpha_init
        self.dyt_alpha_init_attn = dyt_alpha_init_attn
        self.dyt_alpha_init_mlp = dyt_alpha_init_mlp
        self.dyt_alpha_init_final = dyt_alpha_init_final
        self.logit_softcap = logit_softcap  # 0 = off
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
        for name, allowed in (("norm_type", sorted(NORM_TYPES)), ("norm_position", list(NORM_POSITIONS)),
                              ("norm_scaling", list(NORM_SCALINGS)), ("qk_norm", list(QK_NORMS)),
                              ("v_norm", list(V_NORMS)), ("attn_gate", list(ATTN_GATES)),
                              ("attn_sinks", [False, True]), ("embed_norm", list(EMBED_NORMS)),
                              ("norm_gain", list(NORM_GAINS))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.norm_scaling != "none" and self.norm_position not in ("pre", "mix"):
            raise ValueError(f"norm_scaling={self.norm_scaling!r} scales the input norms of Pre-Norm blocks; "
                             f"allowed with norm_position 'pre' or 'mix', got {self.norm_position!r}")
        if self.qk_norm != "none" and self.norm_type == "none":
            raise ValueError(f"qk_norm={self.qk_norm!r} needs a norm to apply; allowed with any norm_type but "
                             "'none' (or set qk_norm='none')")
        if self.v_norm != "none" and self.norm_type == "none":
            raise ValueError(f"v_norm={self.v_norm!r} needs a norm to apply; allowed with any norm_type but "
                             "'none' (or set v_norm='none')")
        for name in ("qk_norm", "v_norm"):
            if self.norm_position in QKV_PLACEMENTS and getattr(self, name) != "head":
                raise ValueError(f"norm_position={self.norm_position!r} (HybridNorm) normalizes q, k and v per head "
                                 f"in place of the attention input norm, so it implies {name}='head'; got "
                                 f"{name}={getattr(self, name)!r}: leave {name} unset or set it to 'head'")
        if not isinstance(self.sub_norm, bool):
            raise ValueError(f"sub_norm must be true or false, got {self.sub_norm!r}")
        for name, adds_norms in (("sub_norm", self.sub_norm), ("embed_norm", self.embed_norm == "norm")):
            if adds_norms and self.norm_type == "none":
                raise ValueError(f"{name}={getattr(self, name)!r} adds norms; allowed with any norm_type but 'none'")
        if self.norm_gain != "w" and not NORM_TYPES[self.norm_type].gain:
            raise ValueError(f"norm_gain={self.norm_gain!r} reparametrizes a norm's gain, and "
                             f"norm_type={self.norm_type!r} has none; allowed with "
                             f"{[n for n, t in NORM_TYPES.items() if t.gain]}")
        if not 0 <= self.mix_ln_fraction <= 1:
            raise ValueError(f"mix_ln_fraction must be in [0, 1], got {self.mix_ln_fraction}")
        if not 0 <= self.logit_softcap < math.inf:
            raise ValueError(f"logit_softcap must be a finite number >= 0 (0 = off), got {self.logit_softcap}")
        for name in ("deepnorm_alpha", "deepnorm_beta", "dyt_alpha_init", "dyt_alpha_init_attn", "dyt_alpha_init_mlp",
                     "dyt_alpha_init_final"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (or unset for the default), got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# ----------------------------------------------------------------------------------------------------------
# Normalization: RMSNorm here, the other types in model/norms.py; NORM_TYPES below is the registry of all.


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight  (Zhang & Sennrich 2019). No mean subtraction, no bias.

    The statistics are computed in float32 and the result cast back, because mean(x^2) over 512 bf16 values
    loses most of its precision; the weight multiplies the cast-back value, as in Llama, so under autocast
    (bf16 x, float32 weight) the output is float32. elementwise_affine=False gives the parameter-free variant.
    The arithmetic lives in model/rmsnorm_kernels.py: the eager formula
        xf = x.float(); (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    or, with the same output bit for bit, a faster way to run it, chosen by device and dtype from measurement.
    one_plus_w=True stores the gain as w (starting at 0) and applies 1 + w in Gemma 2/3's order: all in float32,
    cast to x's dtype last (model/norms.py, gain_of).
    """

    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True, one_plus_w: bool = False):
        super().__init__()
        self.eps = eps
        self.one_plus_w = one_plus_w
        self.weight = nn.Parameter(torch.full((dim,), 0.0 if one_plus_w else 1.0)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_plus_w and self.weight is not None:  # the same kernel on float32 x, so in fp32 it is exact
            return rms_norm(x.float(), gain_of(self), self.eps).to(x.dtype)
        return rms_norm(x, self.weight, self.eps)


@dataclass(frozen=True)
class NormType:
    """One entry of the norm registry: how to build a norm of this type for a slot, and how to initialize it."""

    cls: type[nn.Module] | None  # what count_norms counts; None = no norm at all
    build: Callable[[int, MiniMindConfig, str], nn.Module] | None = None  # (dim, config, site) -> a module
    init: Callable[[nn.Module], None] | None = None  # the fresh-model state (also for buffers)
    hf_rmsnorm: bool = False  # computes what HF's RMSNorm (Llama, Qwen3, OLMo 2) computes, gains included
    gain: bool = True  # has a learnable gain (which norm_gain='one_plus_w' stores as w, applied as 1 + w)
    help: str = ""


def _init_affine(m: nn.Module) -> None:
    if m.weight is not None:  # a gain of 1 either way: stored as 1, or as w = 0 applied as 1 + w
        init.constant_(m.weight, 0.0 if m.one_plus_w else 1.0)
    if getattr(m, "bias", None) is not None:
        init.zeros_(m.bias)


def _init_batchnorm(m: BatchNorm) -> None:
    _init_affine(m)
    init.zeros_(m.running_mean)
    init.ones_(m.running_var)
    init.zeros_(m.num_batches_tracked)


def _init_dyt(m: DyT) -> None:
    _init_affine(m)
    init.constant_(m.alpha, m.alpha_init)


def _init_derf(m: Derf) -> None:
    _init_affine(m)
    init.constant_(m.alpha, m.alpha_init)
    init.zeros_(m.shift)


def _init_seednorm(m: SeeDNorm) -> None:
    _init_affine(m)
    init.ones_(m.alpha)
    init.zeros_(m.beta)


def dyt_alpha(cfg: MiniMindConfig, site: str) -> float:
    """DyT's starting alpha for a norm at site 'attn', 'mlp', 'final' or 'qk' (per-position where set)."""
    per_site = getattr(cfg, f"dyt_alpha_init_{site}", None)
    return cfg.dyt_alpha_init if per_site is None else per_site


def one_plus_w(cfg: MiniMindConfig) -> bool:
    return cfg.norm_gain == "one_plus_w"


NORM_TYPES = {
    "rmsnorm": NormType(
        RMSNorm, lambda dim, cfg, site: RMSNorm(dim, cfg.rms_norm_eps, one_plus_w=one_plus_w(cfg)), _init_affine,
        hf_rmsnorm=True, help="x / rms(x) * gain (Llama)"),
    "rmsnorm_noparam": NormType(
        RMSNorm, lambda dim, cfg, site: RMSNorm(dim, cfg.rms_norm_eps, elementwise_affine=False), _init_affine,
        hf_rmsnorm=True, gain=False, help="RMSNorm without gains"),
    "ssnorm": NormType(
        SSNorm, lambda dim, cfg, site: SSNorm(cfg.rms_norm_eps, one_plus_w(cfg)), _init_affine,
        help="x / rms(x) * one scalar gain (single-scale RMSNorm, OSP 2025)"),
    "layernorm": NormType(
        LayerNorm, lambda dim, cfg, site: LayerNorm(dim, cfg.rms_norm_eps, one_plus_w(cfg)), _init_affine,
        help="(x - mean) / std * gain + bias (GPT-2)"),
    "dyt": NormType(
        DyT, lambda dim, cfg, site: DyT(dim, dyt_alpha(cfg, site), one_plus_w(cfg)), _init_dyt,
        help="gain * tanh(alpha * x) + bias, no statistics (DyT, 2025)"),
    "derf": NormType(
        Derf, lambda dim, cfg, site: Derf(dim, dyt_alpha(cfg, site), one_plus_w(cfg)), _init_derf,
        help="gain * erf(alpha * x + shift) + bias, no statistics (Derf, 2025)"),
    "seednorm": NormType(
        SeeDNorm, lambda dim, cfg, site: SeeDNorm(dim, cfg.rms_norm_eps, one_plus_w(cfg)), _init_seednorm,
        help="[tanh(x . beta) * alpha + gain] * x / rms(x), a per-token gain (SeeDNorm, 2025)"),
    "batchnorm": NormType(
        BatchNorm, lambda dim, cfg, site: BatchNorm(dim, cfg.rms_norm_eps, one_plus_w(cfg)), _init_batchnorm,
        help="statistics over the batch: a demonstration that it leaks future tokens"),
    "none": NormType(None, gain=False, help="no normalization at all"),
}
NORM_MODULES = tuple(dict.fromkeys(t.cls for t in NORM_TYPES.values() if t.cls is not None))


def init_norm(module: nn.Module) -> None:
    """Give a norm module its fresh state (anything else is left alone)."""
    kind = next((t for t in NORM_TYPES.values() if t.cls is not None and type(module) is t.cls), None)
    if kind is not None:
        kind.init(module)


def make_norm(config: MiniMindConfig, site: str, dim: int | None = None) -> nn.Module:
    """A norm of config.norm_type for one slot; an Identity for norm_type='none', so every slot stays callable."""
    build = NORM_TYPES[config.norm_type].build
    return nn.Identity() if build is None else build(dim or config.hidden_size, config, site)


def count_norms(model: nn.Module) -> int:
    """Number of normalization modules (Identity placeholders of norm_type='none' do not count)."""
    return sum(isinstance(m, NORM_MODULES) for m in model.modules())


# ----------------------------------------------------------------------------------------------------------
# The norm plan: where each block normalizes, as data. layer_plans(config) is the only reader of norm_position.


@dataclass(frozen=True)
class Slots:
    """The norm slots around one sublayer F, each the module name of a norm or None (empty slot)."""

    before: str | None = None  # x + F(N(x))
    after: str | None = None  # x + N(F(x))
    around: str | None = None  # N(x + F(x))

    def names(self) -> list[str]:
        return [n for n in (self.before, self.after, self.around) if n]


PRE = (Slots(before="input_layernorm"), Slots(before="post_attention_layernorm"))
POST = (Slots(around="post_attention_layernorm"), Slots(around="post_feedforward_layernorm"))
PERI = (Slots(before="input_layernorm", after="post_attention_layernorm"),
        Slots(before="pre_feedforward_layernorm", after="post_feedforward_layernorm"))
REORDER = (Slots(after="post_attention_layernorm"), Slots(after="post_feedforward_layernorm"))
# HybridNorm: Post-Norm around attention (whose q, k and v carry their own norms) and no norm at the MLP
HYBRID = (Slots(around="post_attention_layernorm"), Slots())
EMPTY = (Slots(), Slots())  # ReZero: no norm at all, a learnable scale on each sublayer's output instead


@dataclass(frozen=True)
class LayerPlan:
    attn: Slots
    mlp: Slots
    skip_scale: float = 1.0  # DeepNorm's alpha: N(alpha * x + F(x))
    input_scale: float = 1.0  # LayerNorm Scaling's 1/sqrt(l) on the 'before' norms' outputs
    init_scale: float = 1.0  # DeepNorm's beta on the initial v_proj, o_proj and MLP weights
    residual_scale: bool = False  # ReZero's x + a * F(x), one learnable a per sublayer


def num_post_blocks(config: MiniMindConfig) -> int:
    """Mix-LN's Post-Norm blocks come first: floor(fraction * L) of them (the epsilon absorbs 0.29 * 100 = 28.99..)."""
    return math.floor(config.mix_ln_fraction * config.num_hidden_layers + 1e-9)


def layer_plans(config: MiniMindConfig) -> list[LayerPlan]:
    L, position = config.num_hidden_layers, config.norm_position
    alpha = beta = 1.0
    if position == "deepnorm":  # DeepNet (2022), decoder-only: alpha = (2L)^(1/4), beta = (8L)^(-1/4)
        alpha = config.deepnorm_alpha or (2 * L) ** 0.25
        beta = config.deepnorm_beta or (8 * L) ** -0.25
    plans = []
    for i in range(L):
        if position == "mix":
            slots = POST if i < num_post_blocks(config) else PRE
        elif position == "hybrid_star":  # HybridNorm*: block 0 is a Pre-Norm block (with the QKV-norm)
            slots = PRE if i == 0 else HYBRID
        else:
            slots = {"pre": PRE, "post": POST, "peri": PERI, "reorder": REORDER, "deepnorm": POST,
                     "hybrid": HYBRID, "rezero": EMPTY}[position]
        scale = 1 / math.sqrt(i + 1) if config.norm_scaling == "depth" else 1.0
        plans.append(LayerPlan(*slots, skip_scale=alpha, input_scale=scale, init_scale=beta,
                               residual_scale=position == "rezero"))
    return plans


def has_final_norm(config: MiniMindConfig) -> bool:
    """A final norm wherever the last block may leave the residual stream un-normalized (Mix-LN keeps it always);
    ReZero has none by design: its model holds no norm at all."""
    return config.norm_position not in ("post", "deepnorm", "rezero")


def builds_norms(config: MiniMindConfig) -> bool:
    """Whether any slot holds a norm of norm_type: every placement's blocks or final norm do, except ReZero's,
    which has norms only where a switch (QK-, V-, sub- or embedding norm) adds them."""
    return (config.norm_position != "rezero" or config.qk_norm != "none" or config.v_norm != "none"
            or config.sub_norm or config.embed_norm == "norm")


# Setups best known by the recipe that uses them: norm_variant() gives them that name instead of the systematic
# one, and study/variants.py lists them under it.
RECIPES = {"pre+qk_head+embed_norm+softcap15-rmsnorm_noparam": "nanochat"}


def norm_variant(config: MiniMindConfig) -> str:
    """A short name for the whole normalization setup, e.g. 'pre-rmsnorm', 'pre+depth+qk_head-rmsnorm', 'rezero'
    (no norm anywhere, so no norm type), or a recipe's name from RECIPES ('nanochat')."""
    placement = config.norm_position
    if placement == "mix" and config.mix_ln_fraction != 0.25:
        placement += f"{config.mix_ln_fraction:g}"
    if config.norm_scaling != "none":
        placement += f"+{config.norm_scaling}"
    if config.norm_position in QKV_PLACEMENTS:
        pass  # HybridNorm always has the QKV-norm
    elif config.qk_norm == config.v_norm == "head":
        placement += "+qkv"  # QKV-norm: per-head norms on q, k and v
    else:
        placement += f"+qk_{config.qk_norm}" if config.qk_norm != "none" else ""
        placement += f"+v_{config.v_norm}" if config.v_norm != "none" else ""
    placement += "+sub" if config.sub_norm else ""
    placement += f"+embed_{config.embed_norm}" if config.embed_norm != "none" else ""
    placement += "+one_plus_w" if config.norm_gain == "one_plus_w" else ""
    placement += {"none": "", "elementwise": "+gate", "headwise": "+gate_head"}[config.attn_gate]
    placement += "+sinks" if config.attn_sinks else ""
    placement += f"+softcap{config.logit_softcap:g}" if config.logit_softcap else ""
    if not builds_norms(config):  # the norm type is unused, so the name leaves it out: 'rezero'
        return placement
    name = f"{placement}-{config.norm_type}"
    return RECIPES.get(name, name)


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
    def __init__(self, config: MiniMindConfig, layer_idx: int, init_scale: float = 1.0):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        # Output gate (Qiu et al. 2025): q_proj also computes, per head, gate_dim gate logits right after that
        # head's query (Qwen3-Next's layout, elementwise: head_dim of them; headwise: one), so the gate sees exactly
        # what q_proj sees and adds no module; sigmoid(gate) then scales the head's attention output.
        self.gate_dim = {"none": 0, "headwise": 1, "elementwise": self.head_dim}[config.attn_gate]
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * (self.head_dim + self.gate_dim), bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)
        self.v_proj.init_scale = self.o_proj.init_scale = init_scale  # DeepNorm's beta; q and k keep gain 1
        # QK-norm bounds the attention logits: per head (Qwen3) or over the whole projection, mixing heads (OLMo 2)
        self.qk_norm = config.qk_norm
        if self.qk_norm != "none":
            per_head = self.qk_norm == "head"
            self.q_norm = make_norm(config, "qk", self.head_dim if per_head else self.n_heads * self.head_dim)
            self.k_norm = make_norm(config, "qk", self.head_dim if per_head else self.n_kv_heads * self.head_dim)
        # V-norm (Gemma 3n/4's QKV-norm, HybridNorm): with q and k normalized too, attention no longer depends on
        # the scale of its input at all, since v is the only path by which that scale reached the output
        self.v_norm = make_norm(config, "qk", self.head_dim) if config.v_norm == "head" else None
        # Learnable sinks (GPT-OSS, DeepSeek-V4): one logit per head that joins each softmax row, so a head can put
        # probability on "nothing" instead of on a real token. Zero at init (DeepSeek-V4; GPT-OSS draws it from
        # N(0, 0.02)): it draws no random numbers, so every other weight starts as in the sink-free model.
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if config.attn_sinks else None
        # Sub-LN (BitNet; NormFormer's head-output norm): the concatenated heads normalized before o_proj
        self.attn_sub_norm = make_norm(config, "attn", self.n_heads * self.head_dim) if config.sub_norm else None

    def project_qk(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Queries [batch, heads, seq, head_dim] and keys [batch, kv_heads, seq, head_dim] as attention uses them:
        after QK-norm, which comes before RoPE (so a norm gain acts in the unrotated basis, as in Qwen3/OLMo 2);
        and the output gate's logits [batch, seq, heads, gate_dim] (None without a gate)."""
        bsz, seq, _ = x.shape
        q, k = self.q_proj(x), self.k_proj(x)
        gate = None
        if self.gate_dim:
            q, gate = q.view(bsz, seq, self.n_heads, -1).split([self.head_dim, self.gate_dim], dim=-1)
            q = q.reshape(bsz, seq, -1)
        if self.qk_norm == "proj":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(bsz, seq, self.n_heads, self.head_dim)
        k = k.view(bsz, seq, self.n_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q.transpose(1, 2), *rope), apply_rotary(k.transpose(1, 2), *rope), gate

    def sink_bias(self, mask: torch.Tensor | None, q_len: int, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
        """The float mask [batch or 1, heads, q, kv + 1] that adds the sinks to SDPA: 0 where a key may be seen,
        -inf where not, and in the last column, an extra all-zero key and value, each head's sink. That key's
        logit is q.0 + sink = sink, and its zero value adds nothing to the output: exactly softmax over
        (logits, sink) with the sink's column dropped afterwards, as GPT-OSS writes it, with the KV cache unchanged."""
        if mask is None:  # SDPA's causal fast path was exact: the same triangle, aligned to the last query
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=self.sinks.device).tril(kv_len - q_len)
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)
        bias = bias.expand(*bias.shape[:-3] or (1,), self.n_heads, q_len, kv_len)
        sinks = self.sinks.to(dtype)[:, None, None].expand(bias.shape[0], -1, q_len, 1)
        return torch.cat([bias, sinks], dim=-1)

    def forward(self, x, rope, mask, past_key_values: Cache | None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q, k, gate = self.project_qk(x, rope)
        v = self.v_proj(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        if self.v_norm is not None:
            v = self.v_norm(v)
        v = v.transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        if self.sinks is not None:  # the sink's key and value join only here, never the cache
            mask = self.sink_bias(mask, seq, k.shape[2], q.dtype)
            k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and seq > 1, enable_gqa=self.n_kv_heads != self.n_heads
        ).transpose(1, 2)
        if gate is not None:
            y = y * torch.sigmoid(gate)
        y = y.reshape(bsz, seq, -1)
        if self.attn_sub_norm is not None:
            y = self.attn_sub_norm(y)
        return self.o_proj(y)


# ----------------------------------------------------------------------------------------------------------
# Feed-forward: SwiGLU (Shazeer 2020), down(silu(gate(x)) * up(x)).


class FeedForward(nn.Module):
    def __init__(self, config: MiniMindConfig, init_scale: float = 1.0):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        for proj in (self.gate_proj, self.up_proj, self.down_proj):
            proj.init_scale = init_scale  # DeepNorm's beta
        # Sub-LN (BitNet; NormFormer's FFN norm): the SwiGLU product normalized before down_proj
        self.ffn_sub_norm = make_norm(config, "mlp", config.intermediate_size) if config.sub_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(h if self.ffn_sub_norm is None else self.ffn_sub_norm(h))


# ----------------------------------------------------------------------------------------------------------
# One block, for every placement: its LayerPlan says which norm slots hold a norm and how to scale.


class MiniMindBlock(nn.Module):
    def __init__(self, config: MiniMindConfig, layer_idx: int, plan: LayerPlan):
        super().__init__()
        self.plan = plan
        self.self_attn = Attention(config, layer_idx, plan.init_scale)
        self.mlp = FeedForward(config, plan.init_scale)
        for site, slots in (("attn", plan.attn), ("mlp", plan.mlp)):
            for name in slots.names():
                self.add_module(name, make_norm(config, site))
        if plan.residual_scale:  # ReZero: one scalar per sublayer, 0 at init (set in _init_weights)
            self.attn_residual_scale = nn.Parameter(torch.zeros(1))
            self.mlp_residual_scale = nn.Parameter(torch.zeros(1))

    def forward(self, x, rope, mask, past_key_values=None) -> torch.Tensor:
        x = self.residual(x, self.plan.attn, lambda h: self.self_attn(h, rope, mask, past_key_values), "attn")
        return self.residual(x, self.plan.mlp, self.mlp, "mlp")

    def residual(self, x: torch.Tensor, slots: Slots, sublayer, site: str) -> torch.Tensor:
        """One residual sublayer with whatever norms the plan puts around it. Pre-Norm: x + F(N(x)), whose
        residual path is an untouched sum from the embeddings to the last layer; Post-Norm: N(x + F(x)), which
        renormalizes every sum, so that path passes through 2L norms; ReZero: x + a * F(x), site's scalar a."""
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
            init.normal_(module.weight, mean=0.0, std=std * getattr(module, "init_scale", 1.0))
        elif isinstance(module, RotaryEmbedding):
            init.copy_(module.inv_freq, module.compute_inv_freq())
        elif isinstance(module, Attention) and module.sinks is not None:
            init.zeros_(module.sinks)
        elif isinstance(module, MiniMindBlock) and module.plan.residual_scale:
            init.zeros_(module.attn_residual_scale)
            init.zeros_(module.mlp_residual_scale)
        else:
            init_norm(module)


class MiniMindModel(MiniMindPreTrainedModel):
    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # What the blocks receive from the lookup: as is, times sqrt(hidden_size) (Gemma), or normalized (BLOOM)
        self.embed_norm = config.embed_norm
        if self.embed_norm == "norm":
            self.word_embeddings_layernorm = make_norm(config, "embed")
        self.layers = nn.ModuleList(MiniMindBlock(config, i, plan) for i, plan in enumerate(layer_plans(config)))
        # Pre-Norm leaves the residual stream un-normalized, so it needs one last norm before lm_head.
        self.norm = make_norm(config, "final") if has_final_norm(config) else nn.Identity()
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
        cache: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if cache is not None:  # the name generate() uses from transformers 5.24 on
            past_key_values = cache
        if inputs_embeds is not None:
            x = inputs_embeds  # taken as looked up (and, for "scale", scaled) already, as in Gemma
        else:
            x = self.embed_tokens(input_ids)
            if self.embed_norm == "scale":  # in the weights' dtype: sqrt(d) rounded to float32, then to it (Gemma)
                x = x * torch.tensor(self.config.hidden_size**0.5).to(x.dtype)
        if self.embed_norm == "norm":  # on inputs_embeds too, as in BLOOM
            x = self.word_embeddings_layernorm(x)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + x.shape[1], device=x.device)[None]
        # cos/sin in the dtype q and k are computed in: under autocast the projections' (bf16), as fp32 tables would
        # promote q and k to fp32 for attention to cast them back; without it, the stream's, so fp32 stays exact.
        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        rope = self.rotary_emb(position_ids, dtype)
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
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            **{CACHE_FIELD: past_key_values if use_cache else None},
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
        cache: Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """labels: Hugging Face style, aligned with input_ids and shifted here (-100 = ignore).
        shift_labels: targets already aligned with the logits (what the trainer's batches hold)."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache if cache is not None else past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )
        hidden = out.last_hidden_state if logits_to_keep == 0 else out.last_hidden_state[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        cap = self.config.logit_softcap
        if cap:  # C * tanh(z / C) in float32 (Gemma 2, nanochat): every logit stays within (-C, C)
            logits = cap * torch.tanh(logits.float() / cap)
        if labels is not None:  # position t predicts token t+1; the last position has no target
            shift_labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
        loss = None
        if shift_labels is not None:  # in fp32 even under autocast: a 6400-way log-softmax needs it
            loss = F.cross_entropy(logits.float().flatten(0, 1), shift_labels.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=out.hidden_states, **{CACHE_FIELD: getattr(out, CACHE_FIELD)}
        )
