"""Every norm type, and NORM_TYPES: the one registry that builds, initializes and counts them (by name: --norm).

RMSNorm is the default. Every class here takes the hidden (last) dimension of a [..., dim] tensor, so any of them
fits any norm slot of the model. LayerNorm is torch's nn.LayerNorm with the (1 + w) gain added.

Each takes one_plus_w (the config's norm_gain="one_plus_w"): the gain is stored as w, starting at 0, and applied
as 1 + w (Gemma 2/3, Qwen3-Next, TransformerEngine's zero_centered_gamma). It is the same function at init, but
weight decay now pulls the gain toward 1 instead of 0. As in Gemma, that path computes in float32 and casts to
the input's dtype last; on float32 input it runs the very ops of the plain path, so with w = 0 it matches a plain
gain of 1 bit for bit, forward and backward.
"""


from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from model.rmsnorm_kernels import rms_norm

if TYPE_CHECKING:
    from model.model_minimind import MiniMindConfig


def gain_of(norm: nn.Module) -> torch.Tensor:
    """The gain a norm multiplies by: its weight, or 1 + weight in float32 for one_plus_w."""
    return 1 + norm.weight.float() if norm.one_plus_w else norm.weight


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


class SSNorm(nn.Module):
    """Single-scale RMSNorm (OSP, Park et al. 2025): y = x / sqrt(mean(x^2) + eps) * g with ONE scalar gain g.

    A per-channel gain is a place where a few channels can grow into outliers; one scalar cannot single a channel
    out. Same statistics and cast order as RMSNorm (the parameter-free kernel, then the gain), so at g = 1 it
    computes exactly what RMSNorm with unit gains computes.
    """

    def __init__(self, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__()
        self.eps = eps
        self.one_plus_w = one_plus_w
        self.weight = nn.Parameter(torch.full((1,), 0.0 if one_plus_w else 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_plus_w:
            return (rms_norm(x.float(), None, self.eps) * gain_of(self)).to(x.dtype)
        return rms_norm(x, None, self.eps) * self.weight


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm (with bias), plus the (1 + w) gain."""

    def __init__(self, dim: int, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__(dim, eps=eps, bias=True)
        self.one_plus_w = one_plus_w
        if one_plus_w:
            nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.one_plus_w:
            return super().forward(x)
        return F.layer_norm(x.float(), self.normalized_shape, gain_of(self), self.bias.float(), self.eps).to(x.dtype)


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., CVPR 2025): y = weight * tanh(alpha * x) + bias, with one learnable scalar alpha.

    Not a normalization at all: an elementwise squashing that replaces the norm. alpha starts at alpha_init
    (the paper's default for non-LLM models is 0.5; its LLaMA recipe uses a different value per position, see
    MiniMindConfig.dyt_alpha_init_*), weight at 1 and bias at 0.
    """

    def __init__(self, dim: int, alpha_init: float = 0.5, one_plus_w: bool = False):
        super().__init__()
        self.alpha_init = alpha_init
        self.one_plus_w = one_plus_w
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.weight = nn.Parameter(torch.full((dim,), 0.0 if one_plus_w else 1.0))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_plus_w:
            return (torch.tanh(self.alpha * x.float()) * gain_of(self) + self.bias.float()).to(x.dtype)
        return torch.tanh(self.alpha * x) * self.weight + self.bias


class Derf(nn.Module):
    """Dynamic erf (Chen et al., "Stronger Normalization-Free Transformers", 2025):
    y = weight * erf(alpha * x + shift) + bias, DyT's shape with erf in place of tanh and a learnable shift inside.

    Like DyT an elementwise squashing, not a normalization. alpha is one learnable scalar starting at alpha_init
    (0.5, the paper's); shift, weight and bias are per channel, starting at 0, 1 and 0, so at init it is
    erf(0.5 x): zero-centred, and about 0.56 x for the small activations of a fresh model.
    """

    def __init__(self, dim: int, alpha_init: float = 0.5, one_plus_w: bool = False):
        super().__init__()
        self.alpha_init = alpha_init
        self.one_plus_w = one_plus_w
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.shift = nn.Parameter(torch.zeros(dim))
        self.weight = nn.Parameter(torch.full((dim,), 0.0 if one_plus_w else 1.0))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_plus_w:
            inner = self.alpha * x.float() + self.shift.float()
            return (torch.erf(inner) * gain_of(self) + self.bias.float()).to(x.dtype)
        return torch.erf(self.alpha * x + self.shift) * self.weight + self.bias


class SeeDNorm(nn.Module):
    """Self-rescaled dynamic normalization (Cai et al., 2025): y = [tanh(x . beta) * alpha + weight] * x / RMS(x).

    RMSNorm whose per-channel gain depends on the token: x . beta, a dot product over the hidden dimension, is
    one number per token, squashed by tanh, that scales the learnable vector alpha on top of the static gain
    (weight, RMSNorm's gamma). Because x . beta grows with x's scale, the output keeps some of the input norm that
    RMSNorm discards. RMS(x) = sqrt(mean(x^2) + eps), computed as RMSNorm computes it (float32 statistics, cast
    back); the dot product is taken in float32 too, as it sums hidden_size products.

    Init: weight 1, beta 0, alpha 1, so a fresh SeeDNorm is RMSNorm exactly (tanh(0) = 0). beta must start at 0
    for that and alpha must not: with both at 0 neither gets a gradient (each one's gradient is proportional to
    the other) and the norm stays RMSNorm forever. The paper's own values for alpha and beta could not be
    confirmed here; these are the ones that start as RMSNorm and can still learn.
    """

    def __init__(self, dim: int, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__()
        self.eps = eps
        self.one_plus_w = one_plus_w
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        self.weight = nn.Parameter(torch.full((dim,), 0.0 if one_plus_w else 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dynamic = torch.tanh((x.float() * self.beta).sum(-1, keepdim=True)) * self.alpha
        if self.one_plus_w:
            return (rms_norm(x.float(), None, self.eps) * (dynamic + gain_of(self))).to(x.dtype)
        return rms_norm(x, None, self.eps) * (dynamic + self.weight)


class BatchNorm(nn.BatchNorm1d):
    """BatchNorm over every (sequence, position) of the batch, per channel: a demonstration, not a choice.

    In training mode each position is normalized with statistics taken over the whole batch, later tokens
    included, so a token's output depends on the future of its own sequence and on the other sequences in the
    batch: the causal mask is broken and the training loss is not the loss the model will see when it
    generates. In eval mode it uses running averages instead, so the same text gives other logits than in
    training. That contrast is what it is here to show (tests/test_norms.py checks the leak).
    """

    def __init__(self, dim: int, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__(dim, eps=eps)
        self.one_plus_w = one_plus_w
        if one_plus_w:
            nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if not self.one_plus_w:
            return super().forward(flat).view(x.shape)
        # what nn.BatchNorm1d.forward does with its settings here (momentum 0.1, running statistics tracked)
        if self.training:
            self.num_batches_tracked.add_(1)
        y = F.batch_norm(flat.float(), self.running_mean, self.running_var, gain_of(self), self.bias.float(),
                         self.training, self.momentum, self.eps)
        return y.to(x.dtype).view(x.shape)


@dataclass(frozen=True)
class NormType:
    """One entry of the norm registry: how to build a norm of this type for a slot, and how to initialize it."""

    cls: type[nn.Module] | None  # what count_norms counts; None = no norm at all
    build: Callable[[int, "MiniMindConfig", str], nn.Module] | None = None  # (dim, config, site) -> a module
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


def dyt_alpha(cfg: "MiniMindConfig", site: str) -> float:
    """DyT's starting alpha for a norm at site 'attn', 'mlp', 'final' or 'qk' (per-position where set)."""
    per_site = getattr(cfg, f"dyt_alpha_init_{site}", None)
    return cfg.dyt_alpha_init if per_site is None else per_site


def one_plus_w(cfg: "MiniMindConfig") -> bool:
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


def make_norm(config: "MiniMindConfig", site: str, dim: int | None = None) -> nn.Module:
    """A norm of config.norm_type for one slot; an Identity for norm_type='none', so every slot stays callable."""
    build = NORM_TYPES[config.norm_type].build
    return nn.Identity() if build is None else build(dim or config.hidden_size, config, site)


def count_norms(model: nn.Module) -> int:
    """Number of normalization modules (Identity placeholders of norm_type='none' do not count)."""
    return sum(isinstance(m, NORM_MODULES) for m in model.modules())
