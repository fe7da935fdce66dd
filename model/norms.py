"""Every norm type, and NORM_TYPES: the one registry that builds and names them (by name: --norm).
Each takes the last dimension of a [..., dim] tensor, so any fits any slot."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

if TYPE_CHECKING:
    from model.model_minimind import MiniMindConfig


class Norm(nn.Module):
    """What every norm type shares: its gain. With one_plus_w (norm_gain="one_plus_w") the gain is
    stored as w, starting at 0, and applied as 1 + w (Gemma 2/3, Qwen3-Next): the same function at
    init, but weight decay pulls the gain toward 1 instead of 0. As in Gemma that path computes in
    float32 and casts to the input's dtype last; on float32 it runs the plain ops, w = 0 exact."""

    def __init__(self, one_plus_w: bool):
        super().__init__()
        self.one_plus_w = one_plus_w

    def unit_gain(self, dim: int) -> nn.Parameter:
        """A gain of 1 per channel: stored as 1, or as w = 0 applied as 1 + w."""
        return nn.Parameter(torch.full((dim,), 0.0 if self.one_plus_w else 1.0))

    def with_gain(self, x: torch.Tensor, formula: Callable) -> torch.Tensor:
        """formula(x, gain) with the weight, or (one_plus_w) on float32 x with 1 + w, cast back."""
        if self.one_plus_w:
            return formula(x.float(), 1 + self.weight.float()).to(x.dtype)
        return formula(x, self.weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps), the statistics in float32 (mean(x^2) over 512 bf16 values loses
    most of its precision), rounded to x's dtype before the weight multiplies, as in Llama."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else y * weight


class RMSNorm(Norm):
    """y = x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019); no weight if not affine."""

    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True,
                 one_plus_w: bool = False):
        super().__init__(one_plus_w and elementwise_affine)  # without a gain, nothing to store as w
        self.eps = eps
        self.weight = self.unit_gain(dim) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_gain(x, lambda x, gain: rms_norm(x, gain, self.eps))


class SSNorm(Norm):
    """Single-scale RMSNorm (OSP, Park et al. 2025): x / sqrt(mean(x^2) + eps) * g with ONE scalar
    gain g, so no channel's gain can grow into an outlier; at g = 1 exactly unit-gain RMSNorm."""

    def __init__(self, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.eps = eps
        self.weight = self.unit_gain(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_gain(x, lambda x, gain: rms_norm(x, None, self.eps) * gain)


class LayerNorm(Norm):
    """(x - mean) / sqrt(var + eps) * weight + bias (GPT-2), torch's layer_norm."""

    def __init__(self, dim: int, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.eps = eps
        self.weight = self.unit_gain(dim)
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def layer_norm(x, gain):
            return F.layer_norm(x, self.weight.shape, gain, self.bias.to(gain.dtype), self.eps)

        return self.with_gain(x, layer_norm)


class Squashing(Norm):
    """gain * f(alpha * x) + bias, alpha one learnable scalar: not a normalization, an elementwise
    squashing in its place. DyT (Zhu et al., CVPR 2025) squashes with tanh; Derf (Chen et al. 2025)
    with erf, after a per-channel shift (shifted=True): at init erf(0.5 x), zero-centred."""

    def __init__(self, dim: int, squash: Callable, alpha_init: float = 0.5, shifted: bool = False,
                 one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.squash, self.alpha_init = squash, alpha_init
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.shift = nn.Parameter(torch.zeros(dim)) if shifted else None
        self.weight = self.unit_gain(dim)
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def squashed(x, gain):
            z = self.alpha * x if self.shift is None else self.alpha * x + self.shift.to(gain.dtype)
            return self.squash(z) * gain + self.bias.to(gain.dtype)

        return self.with_gain(x, squashed)


class SeeDNorm(Norm):
    """Self-rescaled dynamic normalization (Cai et al. 2025): [tanh(x . beta) * alpha + weight] * x
    / RMS(x), a per-token gain that keeps some of the input's scale; x . beta in float32, as it sums
    hidden_size products. It starts as RMSNorm (beta 0, alpha 1); alpha must not start at 0 too, as
    each of alpha and beta gets a gradient proportional to the other."""

    alpha_init = 1.0

    def __init__(self, dim: int, eps: float = 1e-5, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        self.weight = self.unit_gain(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dynamic = torch.tanh((x.float() * self.beta).sum(-1, keepdim=True)) * self.alpha
        return self.with_gain(x, lambda x, gain: rms_norm(x, None, self.eps) * (dynamic + gain))


@dataclass(frozen=True)
class NormType:
    """One entry of the norm registry: how to build a norm of this type, and what it is."""

    build: Callable[[int, "MiniMindConfig"], nn.Module] | None  # (dim, config) -> a norm, or None
    help: str
    hf_rmsnorm: bool = False  # computes what HF's RMSNorm (Llama, Qwen3, OLMo 2) computes
    gain: bool = True  # has a learnable gain (which norm_gain='one_plus_w' stores as w)


def one_plus_w(cfg: "MiniMindConfig") -> bool:
    return cfg.norm_gain == "one_plus_w"


NORM_TYPES = {
    "rmsnorm": NormType(lambda dim, cfg: RMSNorm(dim, cfg.rms_norm_eps, one_plus_w=one_plus_w(cfg)),
                        "x / rms(x) * gain (Llama)", hf_rmsnorm=True),
    "rmsnorm_noparam": NormType(lambda dim, cfg: RMSNorm(dim, cfg.rms_norm_eps, False),
                                "RMSNorm without gains", hf_rmsnorm=True, gain=False),
    "ssnorm": NormType(lambda dim, cfg: SSNorm(cfg.rms_norm_eps, one_plus_w(cfg)),
                       "x / rms(x) * one scalar gain (single-scale RMSNorm, OSP 2025)"),
    "layernorm": NormType(lambda dim, cfg: LayerNorm(dim, cfg.rms_norm_eps, one_plus_w(cfg)),
                          "(x - mean) / std * gain + bias (GPT-2)"),
    "dyt": NormType(lambda dim, cfg: Squashing(dim, torch.tanh, cfg.dyt_alpha_init, False, one_plus_w(cfg)),
                    "gain * tanh(alpha * x) + bias, no statistics (DyT, 2025)"),
    "derf": NormType(lambda dim, cfg: Squashing(dim, torch.erf, cfg.dyt_alpha_init, True, one_plus_w(cfg)),
                     "gain * erf(alpha * x + shift) + bias, no statistics (Derf, 2025)"),
    "seednorm": NormType(lambda dim, cfg: SeeDNorm(dim, cfg.rms_norm_eps, one_plus_w(cfg)),
                         "[tanh(x . beta) * alpha + gain] * x / rms(x), a per-token gain (SeeDNorm, 2025)"),
    "none": NormType(None, "no normalization at all", gain=False),
}
NORM_MODULES = (Norm,)  # what counts as a norm (count_norms, the optimizer's groups)


def init_norm(module: nn.Module) -> None:
    """Give a norm its fresh state (anything else is left alone): gains 1 (stored as 1, or as w = 0
    for 1 + w), alpha its start, everything else (biases, shifts, beta) 0."""
    if isinstance(module, Norm):
        starts = {"weight": 0.0 if module.one_plus_w else 1.0, "alpha": getattr(module, "alpha_init", None)}
        for name, tensor in module.named_parameters(recurse=False):
            init.constant_(tensor, starts.get(name, 0.0))


def make_norm(config: "MiniMindConfig", dim: int | None = None) -> nn.Module:
    """A norm of config.norm_type; an Identity for norm_type='none', every slot callable."""
    build = NORM_TYPES[config.norm_type].build
    return nn.Identity() if build is None else build(dim or config.hidden_size, config)


def count_norms(model: nn.Module) -> int:
    """Number of normalization modules (Identity placeholders of norm_type='none' do not count)."""
    return sum(isinstance(m, NORM_MODULES) for m in model.modules())
