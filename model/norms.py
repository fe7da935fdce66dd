"""Every norm type, each a module whose forward is its formula;
NORM_TYPES, the registry that names them (by name: --norm);
make_norm, which makes one from plain values.

Each normalizes the last dimension of a [..., dim] tensor, so any fits any slot."""

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init


class Norm(nn.Module):
    """What every norm type shares: its gain.
    With one_plus_w (norm_gain="one_plus_w") the gain is stored as w, starting at 0,
    and applied as 1 + w (Gemma 2/3, Qwen3-Next): the same function at init, but where
    gains are decayed (--norm_weight_decay) weight decay pulls them toward 1, not 0."""

    def __init__(self, one_plus_w: bool):
        super().__init__()
        self.one_plus_w = one_plus_w

    def unit_gain(self, dim: int) -> nn.Parameter:
        """A gain of 1 per channel: stored as 1, or as w = 0 applied as 1 + w."""
        return nn.Parameter(torch.full((dim,), 0.0 if self.one_plus_w else 1.0))

    @property
    def gain(self) -> torch.Tensor:
        """What the formula multiplies by: the weight, or 1 + w in float32."""
        return 1 + self.weight.float() if self.one_plus_w else self.weight


def float32_with_one_plus_w(forward: Callable) -> Callable:
    """A norm's forward as Gemma runs a (1 + w) gain:
    on x in float32, the output cast to x's dtype once, last.
    With a plain gain it runs on x as given.
    On float32 x both are the same ops, so w = 0 is exactly a gain of 1."""

    @functools.wraps(forward)
    def run(norm: Norm, x: torch.Tensor, *args) -> torch.Tensor:
        if not norm.one_plus_w:
            return forward(norm, x, *args)
        return forward(norm, x.float(), *args).to(x.dtype)

    return run


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps), the statistics in float32
    (mean(x^2) over 512 bf16 values loses most of its precision),
    rounded to x's dtype before any gain multiplies, as in Llama."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(Norm):
    """y = x / sqrt(mean(x^2) + eps) * gain (Zhang & Sennrich 2019);
    no gain if not affine."""

    def __init__(self, dim: int, eps: float = 1e-5, *, elementwise_affine: bool = True,
                 one_plus_w: bool = False):
        # without a gain, nothing to store as w
        super().__init__(one_plus_w and elementwise_affine)
        self.eps = eps
        self.weight = self.unit_gain(dim) if elementwise_affine else None

    @float32_with_one_plus_w
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalized = rms_normalized(x, self.eps)
        return normalized if self.weight is None else normalized * self.gain


class SSNorm(Norm):
    """Single-scale RMSNorm (OSP, Park et al. 2025):
    x / sqrt(mean(x^2) + eps) * g with ONE scalar gain g,
    so no channel's gain can grow into an outlier;
    at g = 1 exactly unit-gain RMSNorm."""

    def __init__(self, eps: float = 1e-5, *, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.eps = eps
        self.weight = self.unit_gain(1)

    @float32_with_one_plus_w
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalized(x, self.eps) * self.gain


class LayerNorm(Norm):
    """(x - mean) / sqrt(var + eps) * gain + bias (GPT-2),
    computed by torch's layer_norm."""

    def __init__(self, dim: int, eps: float = 1e-5, *, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.eps = eps
        self.weight = self.unit_gain(dim)
        self.bias = nn.Parameter(torch.zeros(dim))

    @float32_with_one_plus_w
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = self.gain
        return F.layer_norm(x, gain.shape, gain, self.bias.to(gain.dtype), self.eps)


class Squashing(Norm):
    """gain * f(alpha * x) + bias, alpha one learnable scalar:
    not a normalization, an elementwise squashing in its place.
    DyT (Zhu et al., CVPR 2025) squashes with tanh;
    Derf (Chen et al. 2025) with erf, after a per-channel shift:
    at init erf(0.5 x), zero-centred."""

    def __init__(self, dim: int, squash: Callable, *, alpha_init: float = 0.5,
                 per_channel_shift: bool = False, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.squash = squash
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.shift = nn.Parameter(torch.zeros(dim)) if per_channel_shift else None
        self.weight = self.unit_gain(dim)
        self.bias = nn.Parameter(torch.zeros(dim))

    @float32_with_one_plus_w
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = self.gain
        z = self.alpha * x
        if self.shift is not None:
            z = z + self.shift.to(gain.dtype)
        return self.squash(z) * gain + self.bias.to(gain.dtype)


class SeeDNorm(Norm):
    """Self-rescaled dynamic normalization (Cai et al. 2025):
    [tanh(x . beta) * alpha + gain] * x / RMS(x),
    a per-token gain that keeps some of the input's scale.
    It starts as RMSNorm (beta 0, alpha 1); alpha must not start at 0 too,
    as each of alpha and beta gets a gradient proportional to the other."""

    alpha_init = 1.0

    def __init__(self, dim: int, eps: float = 1e-5, *, one_plus_w: bool = False):
        super().__init__(one_plus_w)
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        self.weight = self.unit_gain(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x . beta in float32, as it sums hidden_size products; cast here from x as given,
        # not taken from rescaled()'s cast, so that a bf16 x's gradient rounds as before
        dynamic = torch.tanh((x.float() * self.beta).sum(-1, keepdim=True)) * self.alpha
        return self.rescaled(x, dynamic)

    @float32_with_one_plus_w
    def rescaled(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        """(dynamic + gain) * x / RMS(x)."""
        gain = self.gain
        return rms_normalized(x, self.eps) * (dynamic + gain)


@dataclass(frozen=True)
class NormType:
    """One entry of the norm registry: what a norm of this type is."""

    help: str
    # computes what HF's RMSNorm (Llama, Qwen3, OLMo 2) computes
    hf_rmsnorm: bool = False
    gain: bool = True  # has a learnable gain (which norm_gain='one_plus_w' stores as w)


NORM_TYPES = {
    "rmsnorm": NormType("x / rms(x) * gain (Llama)", hf_rmsnorm=True),
    "rmsnorm_noparam": NormType("RMSNorm without gains", hf_rmsnorm=True, gain=False),
    "ssnorm": NormType("x / rms(x) * one scalar gain (single-scale RMSNorm, OSP 2025)"),
    "layernorm": NormType("(x - mean) / std * gain + bias (GPT-2)"),
    "dyt": NormType("gain * tanh(alpha * x) + bias, no statistics (DyT, 2025)"),
    "derf": NormType("gain * erf(alpha * x + shift) + bias, no statistics (Derf, 2025)"),
    "seednorm": NormType("[tanh(x . beta) * alpha + gain] * x / rms(x), "
                         "a per-token gain (SeeDNorm, 2025)"),
    "none": NormType("no normalization at all", gain=False),
}


def init_norm(module: nn.Module) -> None:
    """Give a norm its fresh state (anything else is left alone):
    gains 1 (stored as 1, or as w = 0 for 1 + w), alpha its start,
    everything else (biases, shifts, beta) 0."""
    if isinstance(module, Norm):
        starts = {"weight": 0.0 if module.one_plus_w else 1.0,
                  "alpha": getattr(module, "alpha_init", None)}
        for name, tensor in module.named_parameters(recurse=False):
            init.constant_(tensor, starts.get(name, 0.0))


def make_norm(norm_type: str, dim: int, *, eps: float, one_plus_w: bool,
               alpha_init: float) -> nn.Module:
    """A norm of norm_type over the last dim channels,
    an Identity for 'none' (every slot stays callable).
    eps is every norm's with statistics, alpha_init DyT's and Derf's starting alpha;
    one_plus_w stores the gains as w."""
    builders = {
        "rmsnorm": lambda: RMSNorm(dim, eps, one_plus_w=one_plus_w),
        "rmsnorm_noparam": lambda: RMSNorm(dim, eps, elementwise_affine=False),
        "ssnorm": lambda: SSNorm(eps, one_plus_w=one_plus_w),
        "layernorm": lambda: LayerNorm(dim, eps, one_plus_w=one_plus_w),
        "dyt": lambda: Squashing(dim, torch.tanh, alpha_init=alpha_init,
                                 one_plus_w=one_plus_w),
        "derf": lambda: Squashing(dim, torch.erf, alpha_init=alpha_init,
                                  per_channel_shift=True, one_plus_w=one_plus_w),
        "seednorm": lambda: SeeDNorm(dim, eps, one_plus_w=one_plus_w),
        "none": nn.Identity,
    }
    return builders[norm_type]()


def count_norms(model: nn.Module) -> int:
    """Number of normalization modules
    (Identity placeholders of norm_type='none' do not count)."""
    return sum(isinstance(m, Norm) for m in model.modules())
