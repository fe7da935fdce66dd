"""Held-out evaluation, shared by the trainer (periodic validation) and eval_llm.py (a checkpoint's metrics)."""

import torch
from tqdm import tqdm

from data import BatchSampler


@torch.no_grad()
def evaluate(model, tokens, batch_size: int, seq_len: int, steps: int | None, device, autocast,
             progress: bool = False) -> float:
    """Mean loss per token over consecutive non-overlapping held-out windows: the same text every time.

    steps batches from the start of the split (wrapping around if it is shorter), or with steps=None every
    window exactly once, the last batch holding the remainder. Batches are weighted by their windows, so a
    short last batch counts only as much as the text it covers. The model's train/eval mode is restored.
    """
    was_training = model.training
    model.eval()
    sampler = BatchSampler(tokens, batch_size, seq_len, sequential=True)
    windows = sampler.num_windows if steps is None else steps * batch_size
    total = 0.0
    for start in tqdm(range(0, windows, batch_size), desc="eval", unit="batch", disable=not progress):
        rows = min(batch_size, windows - start)
        x, y = (t[:rows].to(device) for t in next(sampler))
        with autocast:
            total += model(input_ids=x, shift_labels=y).loss.item() * rows
    model.train(was_training)
    return total / windows
