"""The optimizer (AdamW, or Muon for the blocks' matrices with AdamW for the rest)
with the usual decay split, and the warmup + cosine learning-rate schedule."""

import math

import torch
from torch import nn

from model.model_minimind import MiniMindBlock
from model.norms import Norm

OPTIMIZERS = ("adamw", "muon")


def block_matrices(model: nn.Module) -> list[nn.Parameter]:
    """Muon's share: the blocks' q/k/v/o and gate/up/down projections.
    Embeddings, an untied lm_head, norms and scalars are not:
    it orthogonalizes a hidden layer's update (nanochat)."""
    return [m.weight for block in model.modules() if isinstance(block, MiniMindBlock)
            for m in block.modules() if isinstance(m, nn.Linear)]


def adamw_groups(model: nn.Module, weight_decay: float, norm_weight_decay: bool,
                 exclude: set[int]) -> list[dict]:
    """Weight decay on weight matrices only (ids in exclude are Muon's):
    decaying a gain, bias or DyT alpha pulls the norm toward zero output,
    and decaying the tied embedding shrinks rare tokens' vectors.
    norm_weight_decay decays gains too, as OLMo 2 does (a 1 + w gain toward 1)."""
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding)
                 for p in m.parameters()}
    gains = {id(m.weight) for m in model.modules()
             if norm_weight_decay and isinstance(m, Norm)
             and getattr(m, "weight", None) is not None}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad and id(p) not in exclude:
            (decay if (p.ndim >= 2 and id(p) not in embedding) or id(p) in gains
             else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # with Muon, a tied model leaves AdamW no matrix
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float,
                    norm_weight_decay: bool = False,
                    optimizer: str = "adamw") -> "torch.optim.AdamW | MuonWithAdamW":
    """AdamW over every parameter,
    or Muon over block_matrices() and AdamW over the rest."""
    matrices = block_matrices(model) if optimizer == "muon" else []
    # fused: one kernel per parameter group, on CUDA and CPU
    # (16 vs 48 ms a step, 26M model, 2 CPU cores)
    adamw = torch.optim.AdamW(
        adamw_groups(model, weight_decay, norm_weight_decay, {id(p) for p in matrices}),
        lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    if optimizer == "adamw":
        return adamw
    # "match_rms_adamw" (Moonshot, "Muon is Scalable for LLM Training")
    # scales Muon's lr by 0.2 * sqrt(max(fan_out, fan_in)),
    # so a step moves a matrix about as far as an AdamW step:
    # the lr and decay tuned for AdamW, and a study's lr grid,
    # mean the same for both optimizers at every width.
    muon = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay,
                            adjust_lr_fn="match_rms_adamw")
    return MuonWithAdamW(muon, adamw)


class MuonWithAdamW:
    """Muon and AdamW driven as the loop drives AdamW alone:
    param_groups lists both (for the schedule and the GradScaler);
    step(), zero_grad() and state_dict() cover both."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon = muon
        self.adamw = adamw

    @property
    def param_groups(self) -> list[dict]:
        # read afresh each time: load_state_dict replaces each optimizer's group dicts
        return self.adamw.param_groups + self.muon.param_groups

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.adamw.load_state_dict(state["adamw"])
        self.muon.load_state_dict(state["muon"])


def lr_at(step: int, max_steps: int, lr: float, min_lr: float,
          warmup_steps: int) -> float:
    """Linear warmup (step 0 gets lr/warmup_steps),
    then cosine decay to min_lr at max_steps."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))
