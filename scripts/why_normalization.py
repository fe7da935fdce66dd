"""Why normalize? The toy experiment from the MiniMind learning notes, run as written and measured.

A stack of --layers blocks Linear(width, width) -> ReLU, with and without an RMSNorm between the Linear and the
ReLU (the model's own RMSNorm class). Both stacks get the *same* Linear weights (PyTorch's default init), so
the norm is the only difference. Prints, per layer, the std of the block's output and the norm of the Linear's
weight gradient for loss = output.sum(); docs/results/study.md (section 4) reads the result.

    python scripts/why_normalization.py                    # 8 x Linear(512, 512), input randn(32, 512), seed 0
    python scripts/why_normalization.py --layers 32 --json out/why_norm.json

What to expect from the default init (weights U(-1/sqrt(fan_in), 1/sqrt(fan_in))): a Linear keeps 1/3 of its
input's second moment and ReLU halves it, so without a norm the std shrinks by about sqrt(6) per layer until
the bias (same init) sets a floor. With RMSNorm every ReLU output has std sqrt(1/2 - 1/(2 pi)) ~ 0.58, not 1.
"""

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from common.cli import ArgumentParser, require_positive, run_cli
from model.model_minimind import RMSNorm

# What the notes report for the default 8 x 512, batch 32 setup (they give no seed).
NOTES = {"std_layer8_no_norm": 0.0163, "grad_layer1_no_norm": 1.2e-5, "std_rmsnorm": "~1.0 at every layer"}


def measure(linears: list[nn.Linear], x: torch.Tensor, norm: bool) -> dict:
    """Run x through copies of the Linears, Linear -> (RMSNorm) -> ReLU each; backward of the output's sum."""
    linears = copy.deepcopy(linears)
    stds = []
    for linear in linears:
        x = linear(x)
        x = torch.relu(RMSNorm(linear.out_features)(x) if norm else x)
        stds.append(x.std().item())
    x.sum().backward()
    return {"std": stds, "grad_norm": [linear.weight.grad.norm().item() for linear in linears]}


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0, help="seeds the Linear init and the input")
    p.add_argument("--layers", type=int, default=8, help="number of Linear(+RMSNorm)+ReLU blocks")
    p.add_argument("--width", type=int, default=512, help="features of every Linear")
    p.add_argument("--batch", type=int, default=32, help="rows of the random input")
    p.add_argument("--json", type=Path, help="also write the config and both networks' numbers to this JSON file")
    args = p.parse_args(argv)
    require_positive(args, ("layers", "width", "batch"))

    torch.manual_seed(args.seed)
    linears = [nn.Linear(args.width, args.width) for _ in range(args.layers)]
    x = torch.randn(args.batch, args.width)
    plain, normed = measure(linears, x, norm=False), measure(linears, x, norm=True)

    print(f"stack: {args.layers} x [Linear({args.width}, {args.width}) -> (RMSNorm) -> ReLU], default nn.Linear "
          f"init, input randn({args.batch}, {args.width}), seed {args.seed}; input std {x.std().item():.4f}")
    print(f"{'layer':>5}  {'std no-norm':>11}  {'std RMSNorm':>11}  {'|dW| no-norm':>12}  {'|dW| RMSNorm':>12}")
    for i in range(args.layers):
        print(f"{i + 1:>5}  {plain['std'][i]:>11.4g}  {normed['std'][i]:>11.4g}  "
              f"{plain['grad_norm'][i]:>12.3e}  {normed['grad_norm'][i]:>12.3e}")
    print(f"notes claim (no norm): layer-8 std ~{NOTES['std_layer8_no_norm']}, "
          f"layer-1 |dW| ~{NOTES['grad_layer1_no_norm']:.1e}; with RMSNorm std {NOTES['std_rmsnorm']}")
    print(f"measured   (no norm): layer-{args.layers} std {plain['std'][-1]:.4g}, layer-1 |dW| "
          f"{plain['grad_norm'][0]:.3e}; with RMSNorm std {min(normed['std']):.3g}-{max(normed['std']):.3g}")
    print(f"layer-1 / layer-{args.layers} |dW|: no norm {plain['grad_norm'][0] / plain['grad_norm'][-1]:.3g}, "
          f"RMSNorm {normed['grad_norm'][0] / normed['grad_norm'][-1]:.3g}")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != "json"}
        payload = {"config": config, "input_std": x.std().item(), "no_norm": plain, "rmsnorm": normed}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    run_cli(main)
