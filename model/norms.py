"""The norm types besides RMSNorm (which lives in model_minimind.py, as the default): SSNorm, DyT and BatchNorm.

LayerNorm is torch's nn.LayerNorm. Every class here takes the hidden (last) dimension of a [..., dim] tensor, so
any of them fits any norm slot of the model; model_minimind.NORM_TYPES chooses among them by name.
"""

import torch
from torch import nn

from model.rmsnorm_kernels import rms_norm


class SSNorm(nn.Module):
    """Single-scale RMSNorm (OSP, Park et al. 2025): y = x / sqrt(mean(x^2) + eps) * g with ONE scalar gain g.

    A per-channel gain is a place where a few channels can grow into outliers; one scalar cannot single a channel
    out. Same statistics and cast order as RMSNorm (the parameter-free kernel, then the gain), so at g = 1 it
    computes exactly what RMSNorm with unit gains computes.
    """

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, None, self.eps) * self.weight


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., CVPR 2025): y = weight * tanh(alpha * x) + bias, with one learnable scalar alpha.

    Not a normalization at all: an elementwise squashing that replaces the norm. alpha starts at alpha_init
    (the paper's default for non-LLM models is 0.5; its LLaMA recipe uses a different value per position, see
    MiniMindConfig.dyt_alpha_init_*), weight at 1 and bias at 0.
    """

    def __init__(self, dim: int, alpha_init: float = 0.5):
        super().__init__()
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


class BatchNorm(nn.BatchNorm1d):
    """BatchNorm over every (sequence, position) of the batch, per channel: a demonstration, not a choice.

    In training mode each position is normalized with statistics taken over the whole batch, later tokens
    included, so a token's output depends on the future of its own sequence and on the other sequences in the
    batch: the causal mask is broken and the training loss is not the loss the model will see when it
    generates. In eval mode it uses running averages instead, so the same text gives other logits than in
    training. That contrast is what it is here to show (tests/test_norm_plan.py checks the leak).
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.reshape(-1, x.shape[-1])).view(x.shape)
