"""Why a deep stack needs normalization, measured at initialization in seconds on a CPU.

    python scripts/why_normalization.py

1. An 8-layer Linear+ReLU stack (width 512, PyTorch's default init; the loss a fixed random readout): the
   output's std and the first layer's weight-gradient norm, without a norm and with RMSNorm after each layer.
   Without one the signal shrinks layer by layer, and so does the gradient that reaches the first layer.
2. The model at init (8 layers, hidden 128): the residual stream's RMS entering each block (block 0: the
   embeddings), per placement. Under Pre-Norm it grows; where a norm ends each block it stays at 1.
"""

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cli import ArgumentParser, run_cli
from model import NORM_POSITIONS, MiniMindConfig, MiniMindForCausalLM


def linear_relu_stack(norm: bool, layers: int = 8, width: int = 512) -> tuple[float, float]:
    """(output std, first layer's weight-gradient norm) of one forward and backward on a batch of 256."""
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU(), *([nn.RMSNorm(width)] if norm else []))
              for _ in range(layers)]
    stack = nn.Sequential(*blocks)
    out = stack(torch.randn(256, width))
    (out * torch.randn(width)).sum(-1).mean().backward()
    return out.std().item(), blocks[0][0].weight.grad.norm().item()


def residual_rms(position: str) -> list[float]:
    """The residual stream's RMS entering each block of the model at init, on 4 x 64 random tokens."""
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=128, num_hidden_layers=8, num_attention_heads=8,
                                               num_key_value_heads=2, norm_position=position)).eval()
    with torch.no_grad():
        states = model.model(torch.randint(0, 6400, (4, 64)), output_hidden_states=True).hidden_states
    return [h.pow(2).mean().sqrt().item() for h in states[:-1]]  # the last: after the final norm


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0, help="the seed of every initialization and input")
    torch.manual_seed(p.parse_args(argv).seed)
    print("8-layer Linear+ReLU stack | output std | layer-1 weight-gradient norm")
    for norm in (False, True):
        std, grad = linear_relu_stack(norm)
        print(f"{'with RMSNorm' if norm else 'without a norm':<25} | {std:10.3g} | {grad:.3g}")
    print("\nresidual stream RMS entering blocks 0-7 at init (hidden 128, 8 layers)")
    for position in NORM_POSITIONS:
        print(f"{position:<12} " + " ".join(f"{rms:6.2f}" for rms in residual_rms(position)))


if __name__ == "__main__":
    run_cli(main)
