"""Held-out evaluation (the trainer's and eval_llm.py's), and the rule for a run that learned nothing."""

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from data import BatchSampler


@torch.no_grad()
def evaluate(model, tokens, batch_size: int, seq_len: int, steps: int | None, device, autocast,
             progress: bool = False, rank: int = 0, world_size: int = 1) -> float:
    """Mean loss per token over consecutive held-out windows, the same text every time: `steps` batches from
    the start (wrapping around), or every window once. Under DDP each rank takes every world_size-th one."""
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
            # from the logits, as MiniMind's forward computes its loss: other families take no shift_labels
            logits = model(input_ids=x).logits
            total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).double() * rows
    if world_size > 1:
        dist.all_reduce(total)
    model.train(was_training)
    return total.item() / windows


PLATEAU_MARGIN = 0.05  # nats: a model this close to the unigram loss learned nothing from the context


def unigram_loss(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int) -> float:
    """Validation loss (nats per token) of the best context-free model: every token predicted with its
    frequency in the training split, add-one smoothed so a token unseen in training costs a finite amount."""
    counts = np.bincount(train_tokens, minlength=vocab_size) + 1.0
    return float(-np.log(counts / counts.sum())[val_tokens].mean())


def learned_nothing(loss: float, unigram: float) -> bool:
    """A validation loss no better than the unigram model's: the one rule for a run that never learned (a
    plateau, which a study's lr choice skips) and one that lost it (a collapse: the trainer stops it)."""
    return loss > unigram - PLATEAU_MARGIN


def plateaued(val_losses: list[float], unigram: float) -> bool:
    """The last validation loss learned nothing, or is no lower than the first of two or more."""
    return bool(val_losses) and (learned_nothing(val_losses[-1], unigram)
                                 or (len(val_losses) > 1 and val_losses[-1] >= val_losses[0]))
