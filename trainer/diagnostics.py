"""What the normalization study measures inside the real model, and how fast it trains."""

import re

import torch
from torch import nn

# Dense peak FLOP/s per device for bf16/fp16 tensor-core math (vendor datasheets). MFU is only reported for these.
PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


def residual_rms(hidden_states: tuple[torch.Tensor, ...], num_layers: int) -> list[float]:
    """RMS of the residual stream entering each block (hidden_states[i] is block i's input)."""
    return [h.detach().float().pow(2).mean().sqrt().item() for h in hidden_states[:num_layers]]


def block_grad_norms(layers: nn.ModuleList) -> list[float]:
    """L2 norm of each block's parameter gradients: the vanishing/exploding-gradient picture, per layer."""
    norms = []
    for layer in layers:
        grads = [p.grad.detach().float().norm() for p in layer.parameters() if p.grad is not None]
        norms.append(torch.stack(grads).norm().item() if grads else 0.0)
    return norms


def flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention scores (PaLM, appendix B)."""
    return 6 * num_params + 12 * num_layers * hidden_size * seq_len


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS.items() if re.search(rf"\b{key}\b", name)), None)


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated, or on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
