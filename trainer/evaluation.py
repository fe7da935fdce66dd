"""Held-out evaluation (the trainer's and eval_llm.py's);
when a run learned nothing or diverged."""

import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from data import BatchSampler


@torch.no_grad()
def evaluate(model, tokens, batch_size: int, seq_len: int, steps: int | None,
             device, autocast, progress: bool = False,
             rank: int = 0, world_size: int = 1) -> float:
    """Mean loss per token over consecutive held-out windows, the same text every time:
    `steps` batches from the start, or each window once (also when `steps` would
    reach past the split's end: wrapping around would count windows twice);
    under DDP every world_size-th."""
    was_training = model.training
    model.eval()
    sampler = BatchSampler(tokens, batch_size, seq_len, rank=rank,
                           world_size=world_size, shuffle=False)
    windows = sampler.num_windows
    if steps is not None and steps * batch_size < windows:
        windows = steps * batch_size
    mine = len(range(rank, windows, world_size))
    # Summed on the device and read once at the end, not once per batch.
    total = torch.zeros((), dtype=torch.float64, device=device)
    for start in tqdm(range(0, mine, batch_size), desc="eval", unit="batch",
                      disable=not progress):
        rows = min(batch_size, mine - start)
        x, y = (t[:rows].to(device) for t in next(sampler))
        with autocast:
            # from the logits, as MiniMind's forward computes its loss:
            # other families take no shift_labels
            logits = model(input_ids=x).logits
            total += F.cross_entropy(
                logits.float().flatten(0, 1), y.flatten()).double() * rows
    if world_size > 1:
        dist.all_reduce(total)
    model.train(was_training)
    return total.item() / windows


# nats: a model this close to the unigram loss learned nothing from the context
PLATEAU_MARGIN = 0.05


def unigram_loss(train_tokens: np.ndarray, val_tokens: np.ndarray,
                 vocab_size: int) -> float:
    """Validation loss (nats per token) of the best context-free model:
    every token predicted with its frequency in the training split,
    add-one smoothed (an unseen token costs a finite loss)."""
    counts = np.bincount(train_tokens, minlength=vocab_size) + 1.0
    return float(-np.log(counts / counts.sum())[val_tokens].mean())


def learned_nothing(loss: float, unigram: float) -> bool:
    """A validation loss no better than the unigram model's:
    the one rule for a run that never learned (a plateau: a study's lr choice skips it)
    and one that lost it (a collapse: stopped)."""
    return loss > unigram - PLATEAU_MARGIN


def plateaued(val_losses: list[float], unigram: float) -> bool:
    """The last validation loss learned nothing,
    or is no lower than the first of two or more."""
    return bool(val_losses) and (
        learned_nothing(val_losses[-1], unigram)
        or (len(val_losses) > 1 and val_losses[-1] >= val_losses[0]))


# A run can diverge with finite numbers: the loss climbs to thousands of nats,
# or falls back to no better than a unigram model once the logits ignore the input.
# A blow-up is measured from the larger of ln V and the run's first loss
# (deepnorm without a norm starts near 3,200 nats and trains down).
# Only evaluations decide: runs come back from a training spike,
# which is reported, not fatal (docs/training.md).
BLOW_UP = 2  # a loss above BLOW_UP x that: far worse than where it started


def blown_up(loss: float, start: float, vocab_size: int) -> str | None:
    """'more than 2x <reference>'
    when a finite loss is far above where the run began, else None."""
    uniform = math.log(vocab_size)
    if loss <= BLOW_UP * max(start, uniform):
        return None
    return f"more than {BLOW_UP}x " + (
        f"its first loss ({start:.4g})" if start > uniform
        else f"the loss of a uniform guess (ln {vocab_size} = {uniform:.3f})")


def val_divergence(loss: float, step: int, start: float, lowest: float, unigram: float,
                   vocab_size: int) -> str | None:
    """How a validation loss shows the run diverged, in words (None: healthy);
    `lowest`: the lowest before it."""
    if not math.isfinite(loss):  # finite weights whose forward overflows
        return f"the validation loss was {loss} at step {step}"
    reference = blown_up(loss, start, vocab_size)
    if reference:
        return f"the validation loss blew up to {loss:.4g} at step {step}, {reference}"
    if learned_nothing(loss, unigram) and not learned_nothing(lowest, unigram):
        return (f"the validation loss collapsed to {loss:.4f} at step {step}, "
                f"no better than a unigram model's ({unigram:.3f}), "
                f"after it had been down to {lowest:.3f}")
    return None
