"""Held-out evaluation, shared by the trainer (periodic validation) and eval_llm.py (a checkpoint's metrics)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from data import BatchSampler


@torch.no_grad()
def evaluate(model, tokens, batch_size: int, seq_len: int, steps: int | None, device, autocast,
             progress: bool = False, rank: int = 0, world_size: int = 1) -> float:
    """Mean loss per token over consecutive held-out windows, the same text every time: `steps` batches from the
    split's start (wrapping around), or with steps=None every window once. A short last batch counts by its windows.
    Under DDP call it on every rank: each takes every world_size-th window and the sum is all-reduced."""
    was_training = model.training
    model.eval()
    sampler = BatchSampler(tokens, batch_size, seq_len, rank=rank, world_size=world_size, sequential=True)
    windows = sampler.num_windows if steps is None else steps * batch_size
    mine = len(range(rank, windows, world_size))
    # Summed on the device and read once at the end, not once per batch.
    total = torch.zeros((), dtype=torch.float64, device=device)
    for start in tqdm(range(0, mine, batch_size), desc="eval", unit="batch", disable=not progress):
        rows = min(batch_size, mine - start)
        x, y = (t[:rows].to(device) for t in next(sampler))
        with autocast:
            # From the logits, as MiniMind's forward computes its loss (fp32, mean over tokens): exported Llama or
            # Qwen3 classes have no shift_labels argument, and this is the same number for every family.
            logits = model(input_ids=x).logits
            total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).double() * rows
    if world_size > 1:
        dist.all_reduce(total)
    model.train(was_training)
    return total.item() / windows
