"""The optimizer (AdamW, or Muon for the blocks' matrices with AdamW for the rest) with the usual decay split, and
the warmup + cosine learning-rate schedule."""

import math

import torch
from torch import nn

from model.model_minimind import MiniMindBlock
from model.norms import NORM_MODULES

OPTIMIZERS = ("adamw", "muon")


def block_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weight matrices inside the blocks, Muon's share: attention's q/k/v/o and the MLP's gate/up/down
    projections (the attention gate's logits are rows of q_proj, so they come with it). Embeddings, an untied
    lm_head, norm parameters and scalars (DyT's alpha, sinks, ReZero's scales) are not: Muon orthogonalizes a
    hidden layer's update, which fits none of them (nanochat and modded-nanogpt split it the same way)."""
    return [m.weight for block in model.modules() if isinstance(block, MiniMindBlock)
            for m in block.modules() if isinstance(m, nn.Linear)]


def adamw_groups(model: nn.Module, weight_decay: float, norm_weight_decay: bool, exclude: set[int]) -> list[dict]:
    """Weight decay only on weight matrices of linear layers (and on norm gains with norm_weight_decay).

    Exempt: norm gains and biases and DyT's alpha (1-D; decaying them pulls the norm toward zero output), and the
    token embedding (tied to lm_head here: decaying it shrinks rare tokens' vectors that seldom get a gradient).
    norm_weight_decay decays the norm gains too, as some recipes do (OLMo 2, HybridNorm's): a plain gain w is then
    pulled toward 0, a (1 + w) gain toward 1, a confound in norm comparisons that this switch makes explicit.
    Parameters whose id is in exclude belong to another optimizer.
    """
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    gains = {id(m.weight) for m in model.modules()
             if norm_weight_decay and isinstance(m, NORM_MODULES) and getattr(m, "weight", None) is not None}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad and id(p) not in exclude:
            (decay if (p.ndim >= 2 and id(p) not in embedding) or id(p) in gains else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]  # with Muon, a tied model leaves AdamW no matrix


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, norm_weight_decay: bool = False,
                    optimizer: str = "adamw") -> "torch.optim.AdamW | MuonWithAdamW":
    """AdamW over every parameter (adamw_groups' decay split), or with optimizer='muon' Muon over block_matrices()
    and AdamW over the rest."""
    matrices = block_matrices(model) if optimizer == "muon" else []
    # fused: one kernel per parameter group instead of a loop of foreach ops, on CUDA and on CPU alike
    # (measured here: 16 vs 48 ms per step for the 26M model on 2 CPU cores).
    adamw = torch.optim.AdamW(adamw_groups(model, weight_decay, norm_weight_decay, {id(p) for p in matrices}),
                              lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    if optimizer == "adamw":
        return adamw
    # One --learning_rate for both: "match_rms_adamw" (Moonshot's "Muon is Scalable for LLM Training") multiplies
    # Muon's lr by 0.2 * sqrt(max(fan_out, fan_in)). Its orthogonalized update has an RMS of about
    # 1 / sqrt(max(fan_out, fan_in)), so each step then moves a matrix by about 0.2 * lr (RMS), what an AdamW step
    # typically does; the lr and weight decay tuned for AdamW carry over, and a study's lr grid means the same for
    # both optimizers. The default ("original") would put Muon's steps on another scale at every width. Decay is
    # decoupled as in AdamW (p *= 1 - lr * weight_decay, with the unadjusted lr); momentum 0.95 and Nesterov are
    # Muon's defaults.
    muon = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
    return MuonWithAdamW(muon, adamw)


class MuonWithAdamW:
    """Muon and AdamW driven as one optimizer, as the training loop drives AdamW alone: param_groups lists both
    optimizers' groups (so the schedule's group["lr"] and the GradScaler's unscale_ reach every parameter),
    zero_grad() clears both, and state_dict() holds both states, so a checkpoint resumes both exactly."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw
        # Muon creates a momentum buffer at its first step; made now, the skipped-step guard below can always
        # save and restore it (the same zeros Muon would create).
        for p in self.muon_params():
            self.muon.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.saved = [torch.empty_like(t) for t in self.muon_tensors()]

    @property
    def param_groups(self) -> list[dict]:
        # read afresh each time: load_state_dict replaces each optimizer's group dicts
        return self.adamw.param_groups + self.muon.param_groups

    def muon_params(self) -> list[torch.Tensor]:
        return [p for group in self.muon.param_groups for p in group["params"]]

    def muon_tensors(self) -> list[torch.Tensor]:
        """What a Muon step changes: its parameters and their momentum buffers."""
        params = self.muon_params()
        return params + [self.muon.state[p]["momentum_buffer"] for p in params]

    def step_unless(self, skip: torch.Tensor) -> None:
        """Both steps, made a no-op on the device where skip (a 0-d bool tensor) is true: no host read.

        AdamW's fused kernel skips itself (adamw_step_unless). Muon has no such flag, and no cheaper way round is
        correct: a zeroed gradient still moves the weights by the momentum and the decay, and a zero lr still
        changes the momentum (and a NaN gradient would poison it). So the parameters and momentum buffers are
        copied before Muon steps, and afterwards put back wherever skip is true: torch.where selects the saved
        values, non-finite updates included, bit for bit. The cost is one copy of the block matrices and their
        momentum (kept allocated) and two passes over them per step.
        """
        adamw_step_unless(self.adamw, skip)
        tensors = self.muon_tensors()
        with torch.no_grad():
            for saved, t in zip(self.saved, tensors, strict=True):
                saved.copy_(t)
            self.muon.step()
            for saved, t in zip(self.saved, tensors, strict=True):
                t.copy_(torch.where(skip, saved, t))

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


def lr_at(step: int, max_steps: int, lr: float, min_lr: float, warmup_steps: int) -> float:
    """Linear warmup over warmup_steps (step 0 gets lr/warmup_steps), then cosine decay to min_lr at max_steps."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def adamw_step_unless(optimizer: torch.optim.AdamW, skip: torch.Tensor) -> None:
    """optimizer.step(), made a no-op on the device where skip (a 0-d bool tensor) is true: no host read.

    The fused AdamW kernel takes a found_inf flag, the GradScaler's way of skipping an overflowed step; with it
    set the kernel leaves weights, moments and step count untouched.
    """
    optimizer.found_inf = skip.float()
    optimizer.step()
    del optimizer.found_inf


def step_unless(optimizer: "torch.optim.AdamW | MuonWithAdamW", skip: torch.Tensor) -> None:
    """The optimizer's step, skipped on the device where skip is true (see adamw_step_unless, and
    MuonWithAdamW.step_unless for Muon)."""
    if isinstance(optimizer, MuonWithAdamW):
        optimizer.step_unless(skip)
    else:
        adamw_step_unless(optimizer, skip)
