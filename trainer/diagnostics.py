"""What the normalization study measures inside the real model,
and how fast it trains."""

import math
import re
from contextlib import nullcontext

import torch
from torch import nn

# Dense peak FLOP/s of bf16/fp16 tensor-core math with fp32 accumulation
# (NVIDIA's datasheets), by the whole name torch.cuda.get_device_name reports;
# any other device or a MIG slice gets no MFU (docs/gpu.md, "MFU").
PEAK_FLOPS = [
    (r"NVIDIA H100 80GB HBM3|NVIDIA H200", 989e12),
    (r"NVIDIA H100 NVL|NVIDIA H200 NVL", 835e12),
    (r"NVIDIA H100 PCIe", 756e12),
    (r"NVIDIA A100[- ](SXM4?-|PCIE-)?(40|80)GB( PCIe)?", 312e12),
    (r"NVIDIA L40S", 362e12),
    (r"NVIDIA L4", 121e12),
    (r"NVIDIA A10", 125e12),
    (r"NVIDIA GeForce RTX 4090", 165e12),
    (r"NVIDIA GeForce RTX 3090", 71e12),
]


def rms(x: torch.Tensor) -> torch.Tensor:
    """Root mean square over every element: the size of the residual stream."""
    return x.float().pow(2).mean().sqrt()


def block_cosine(x_in: torch.Tensor, x_out: torch.Tensor) -> torch.Tensor:
    """Cosine between each token's residual stream entering and leaving a block,
    averaged over tokens: near 1 where the block barely turns the stream
    (the "curse of depth" of Pre-Norm)."""
    return torch.nn.functional.cosine_similarity(
        x_in.float(), x_out.float(), dim=-1).mean()


def massive_activation_ratio(x: torch.Tensor) -> torch.Tensor:
    """max|x| / median|x| over every element (Sun et al. 2024): a few features
    thousands of times the typical one act as fixed biases and attention sinks.
    Gaussian noise scores about 7 to 8."""
    magnitude = x.detach().float().abs().flatten()
    return magnitude.max() / magnitude.median()


def excess_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """E[(x - mean)^4] / var^2 - 3 over every element: 0 for a Gaussian,
    large when a few activations are far out in the tails
    (the outliers OSP's single-scale RMSNorm targets)."""
    centred = x.detach().double().flatten()
    centred = centred - centred.mean()
    return (centred.pow(4).mean() / centred.pow(2).mean().square() - 3).float()


def causal_logits(q: torch.Tensor, k: torch.Tensor):
    """The attention logits q.k / sqrt(head_dim) in float32, -inf above the diagonal,
    in blocks of about 2^24 (all at once may not fit).
    Query head h reads key head h // (heads / kv_heads)."""
    batch, heads, seq, head_dim = q.shape
    k = k.float().repeat_interleave(heads // k.shape[1], dim=1)
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    chunk = max(1, 2**24 // (heads * seq * seq))
    for qc, kc in zip(q.split(chunk), k.split(chunk), strict=True):
        yield ((qc.float() @ kc.transpose(-1, -2) / math.sqrt(head_dim))
               .masked_fill_(future, -math.inf))


def max_attention_logit(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Largest pre-softmax logit q.k / sqrt(head_dim) over causal pairs
    (key position <= query position), every head and sequence:
    it grows without bound in unstable runs; QK-norm caps it."""
    return torch.stack([logits.amax() for logits in causal_logits(q, k)]).amax()


def first_token_attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The attention probability on the first token,
    where an attention sink forms (Xiao et al. 2023):
    a mean over sequences, heads and queries 1..seq-1 (query 0 has no choice).
    SDPA returns no probabilities, so they are computed here from q and k."""
    total = sum(logits.softmax(-1)[:, :, 1:, 0].sum() for logits in causal_logits(q, k))
    batch, heads, seq, _ = q.shape
    return total / (batch * heads * max(seq - 1, 1))


@torch.no_grad()
def layer_stats(model: nn.Module, input_ids: torch.Tensor, precision=None,
                grad_norms: torch.Tensor | None = None) -> dict[str, list[float]]:
    """Per block, from one extra forward of the uncompiled model on input_ids:
    the residual stream entering it (RMS, max|x|/median|x|, excess kurtosis),
    its cosine with the stream leaving,
    and of its attention the largest causal logit and first_token_attention;
    with grad_norms, the step's block gradient norms.
    Hooks read each block's input and output and its attention's input
    (after the norm the placement puts there) on the raw model,
    so a compiled one is never retraced."""
    keys = ("residual_rms", "block_cosine", "max_attn_logit", "massive_activation",
            "excess_kurtosis", "attn_first_token")
    # the blocks run in order, so each appends its own
    found: dict[str, list] = {key: [] for key in keys}

    def watch_block(block, args, output):
        found["residual_rms"].append(rms(args[0]))
        found["massive_activation"].append(massive_activation_ratio(args[0]))
        found["excess_kurtosis"].append(excess_kurtosis(args[0]))
        found["block_cosine"].append(block_cosine(args[0], output))

    def watch_attention(attention, args):  # blocks call self_attn(h, rope, mask, cache)
        q, k = attention.project_qk(args[0], args[1])
        found["max_attn_logit"].append(max_attention_logit(q, k))
        found["attn_first_token"].append(first_token_attention(q, k))

    handles = [h for layer in model.model.layers
               for h in (layer.register_forward_hook(watch_block),
                         layer.self_attn.register_forward_pre_hook(watch_attention))]
    try:
        with precision or nullcontext():
            model.model(input_ids=input_ids)
    finally:
        for handle in handles:
            handle.remove()
    # block_grad_norms of the step, read back in the same transfer
    if grad_norms is not None:
        found["layer_grad_norm"] = list(grad_norms.to(found["residual_rms"][0].device))
    # One transfer for everything, not one per number.
    values = torch.stack([torch.stack(v) for v in found.values()]).tolist()
    return dict(zip(found, values, strict=True))


def block_grad_norms(layers: nn.ModuleList) -> torch.Tensor:
    """L2 norm of each block's parameter gradients (0 for a block without any),
    as one tensor on the device: the vanishing or exploding gradient, per layer,
    read with layer_stats' one transfer."""
    zero = torch.zeros((), device=next(layers.parameters()).device)
    return torch.stack([
        torch.linalg.vector_norm(torch.stack(grads)) if grads else zero
        for grads in ([p.grad.detach().float().norm()
                       for p in layer.parameters() if p.grad is not None]
                      for layer in layers)
    ])


def flops_per_token(num_params: int, num_layers: int, hidden_size: int,
                    seq_len: int) -> float:
    """Training FLOPs per token: 6 per parameter plus attention's (PaLM, appendix B)."""
    return 6 * num_params + 12 * num_layers * hidden_size * seq_len


def peak_flops(device: torch.device, dtype: torch.dtype,
               name: str | None = None) -> float | None:
    """The dense bf16/fp16 peak of a CUDA device (PEAK_FLOPS),
    or None where it is not known."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = (name or torch.cuda.get_device_name(device)).strip()
    return next((flops for pattern, flops in PEAK_FLOPS
                 if re.fullmatch(pattern, name)), None)


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated, or on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
