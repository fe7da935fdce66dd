"""Training throughput of MiniMind vs transformers' LlamaForCausalLM of identical shape, in one process.

    python scripts/bench_train.py                      # MiniMind2-small shape (25.8M), fp32, CPU
    python scripts/bench_train.py --device cuda --dtype bfloat16 --batch_size 32 --seq_len 512

One step = forward + backward + AdamW step, on the same random batch for both models, whose weights are
identical (the MiniMind state dict is loaded into the Llama). Rounds alternate between the two models so that
a noisy machine slows both alike; the reported figure per model is its median round, and the ratio
MiniMind / Llama is computed from those medians (> 1 means MiniMind is faster).
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM

from model import MiniMindConfig, MiniMindForCausalLM
from model.hf_export import hf_config
from trainer.cli import ArgumentParser, require_positive, run_cli
from trainer.device import autocast, pick_device, resolve_dtype
from trainer.optim import build_optimizer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model, optimizer, x, y, mixed_precision, minimind: bool):
    def step():
        with mixed_precision:
            loss = model(input_ids=x, shift_labels=y).loss if minimind else model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def time_round(step, steps: int, device) -> float:
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return time.perf_counter() - t


def main() -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--hidden_size", type=int, default=512, help="model width (512 = MiniMind2-small)")
    p.add_argument("--num_hidden_layers", type=int, default=8, help="number of blocks")
    p.add_argument("--batch_size", type=int, default=4, help="sequences per step")
    p.add_argument("--seq_len", type=int, default=256, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=3, help="training steps per timed round")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per model (alternating)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    args = p.parse_args()
    require_positive(args, ("hidden_size", "num_hidden_layers", "batch_size", "seq_len", "steps", "rounds"))
    device = pick_device(args.device)
    mixed_precision = autocast(device, resolve_dtype(args.dtype, device))

    torch.manual_seed(0)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers)
    minimind = MiniMindForCausalLM(config).to(device).train()
    llama = LlamaForCausalLM(hf_config(config, "llama")).to(device).train()
    llama.load_state_dict(minimind.state_dict())
    window = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
    x, y = window[:, :-1], window[:, 1:]

    steps = {}
    for name, model in (("minimind", minimind), ("llama", llama)):
        opt = build_optimizer(model, lr=1e-4, weight_decay=0.1)  # the trainer's optimizer, for both
        steps[name] = make_step(torch.compile(model) if args.compile else model, opt, x, y, mixed_precision,
                                name == "minimind")
        steps[name]()  # warm-up: allocations, optimizer state, compilation
    times = {name: [] for name in steps}
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for name, step in steps.items():
            times[name].append(time_round(step, args.steps, device))

    tokens = args.batch_size * args.seq_len * args.steps
    n_params = sum(p.numel() for p in minimind.parameters())
    print(f"\n{n_params / 1e6:.2f}M params, batch {args.batch_size}x{args.seq_len}, {args.dtype}, {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':<10}{'tokens/s':>12}{'s/step':>10}")
    rate = {}
    for name, rounds in times.items():
        rate[name] = tokens / statistics.median(rounds)
        print(f"{name:<10}{rate[name]:>12.0f}{statistics.median(rounds) / args.steps:>10.3f}")
    print(f"ratio minimind/llama: {rate['minimind'] / rate['llama']:.3f}")


if __name__ == "__main__":
    run_cli(main)
