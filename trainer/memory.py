"""Will the model, and a training step, fit in memory? Lower bounds of their needs, checked before the weights and
the first batch are allocated, so that an impossible width, depth or --batch_size is one line instead of minutes of
swapping or an out-of-memory kill."""

import copy
import os
import re
from pathlib import Path

import torch

from common.cli import UserError
from model import MiniMindForCausalLM

# Values autograd keeps per token, per layer and per unit of width, counted with saved_tensors_hooks (19.1 in fp32;
# under 16-bit autocast see docs/gpu.md, "The memory estimate"). Staying under the counts keeps a lower bound.
SAVED_PER_UNIT = 16  # fp32 training
SAVED_PER_UNIT_AUTOCAST = {2: 20, 4: 2}  # bytes per value: values of that size, under 16-bit autocast


def step_memory_bytes(config, num_params: int, batch_size: int, seq_len: int, dtype: torch.dtype) -> int:
    """At least what one micro-step needs: fp32 weights, gradients and AdamW's two moments (16 bytes per
    parameter), the activations kept for the backward pass, and the logits with their fp32 copy and log-softmax
    (4 + 4 bytes each in fp32 training, 2 + 4 + 4 under 16-bit autocast)."""
    tokens = batch_size * seq_len
    units = tokens * config.num_hidden_layers * config.hidden_size
    if dtype in (torch.bfloat16, torch.float16):
        activations = units * sum(width * count for width, count in SAVED_PER_UNIT_AUTOCAST.items())
        logits = tokens * config.vocab_size * (2 + 4 + 4)
    else:
        activations = units * SAVED_PER_UNIT * 4
        logits = tokens * config.vocab_size * (4 + 4)
    return 16 * num_params + activations + logits


def available_memory_bytes(device: torch.device) -> int | None:
    """Free device memory (plus what this process's CUDA allocator already holds), or the host's available
    memory for CPU training (all of it where the system does not say what is available); None if unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device)
    if device.type != "cpu":
        return None
    try:
        meminfo = Path("/proc/meminfo").read_text()
        return int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE).group(1)) * 1024
    except (OSError, AttributeError):  # not Linux
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None


def model_parameters(config) -> int:
    """The number of parameters of the model config describes, exactly, without allocating it: what the second of
    two blocks built on the meta device adds, every block after the first adds too (building 100,000 takes minutes)."""
    def count(layers: int) -> int:
        shallow = copy.deepcopy(config)
        shallow.num_hidden_layers = layers
        with torch.device("meta"):
            return sum(p.numel() for p in MiniMindForCausalLM(shallow).parameters())

    one = count(1)
    return one + (config.num_hidden_layers - 1) * (count(2) - one)


def require_model_fits(config, device: torch.device) -> None:
    """Refuse a model whose weights, gradients and AdamW's two moments (16 bytes per parameter) cannot fit."""
    num_params = model_parameters(config)
    needed = 16 * num_params
    available = available_memory_bytes(device)
    if available is not None and needed > available:
        raise UserError(f"--hidden_size {config.hidden_size} x --num_hidden_layers {config.num_hidden_layers} makes a "
                        f"model of {num_params:,} parameters, whose weights, gradients and AdamW moments need "
                        f"{needed / 2**30:,.1f} GiB, but {device} has {available / 2**30:,.1f} GiB available; "
                        "lower --hidden_size or --num_hidden_layers")


def require_step_fits(config, num_params: int, batch_size: int, seq_len: int, dtype: torch.dtype,
                      device: torch.device) -> None:
    needed = step_memory_bytes(config, num_params, batch_size, seq_len, dtype)
    available = available_memory_bytes(device)
    if available is not None and needed > available:
        raise UserError(f"--batch_size {batch_size} x --max_seq_len {seq_len} needs at least {needed / 2**30:,.1f} "
                        f"GiB for one training step, but {device} has {available / 2**30:,.1f} GiB available; lower "
                        "--batch_size (and raise --accumulation_steps to keep the tokens per step)")
