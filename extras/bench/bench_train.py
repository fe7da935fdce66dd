"""Training throughput of MiniMind vs transformers' LlamaForCausalLM of identical shape, eager and compiled.

    python extras/bench/bench_train.py                  # MiniMind2-small shape (25.8M), fp32, CPU, both modes
    python extras/bench/bench_train.py --device cuda --dtype bfloat16 --batch_size 32 --seq_len 512
    python extras/bench/bench_train.py --modes eager    # no torch.compile (minutes of compiling on 2 cores)

One step = forward + backward + AdamW step (the trainer's optimizer) on the same random batch for every row;
both models hold identical weights and each mode gets its own copies ("compiled" is torch.compile, as the
trainer's --compile). A row's first step is timed apart (for a compiled row, minus a steady step, it is the
compile time); then rounds alternate over all rows so that a noisy machine slows them alike, and each row's
figure is its median round. Ratio MiniMind / Llama per mode: > 1, MiniMind is faster. MFU where the device's
peak is known (trainer/diagnostics.py). docs/performance.md has a run and its reading.
"""

import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM

from common.cli import ArgumentParser, UserError, positive_int, run_cli
from common.environment import environment
from common.fs import write_atomically
from extras.interop.hf_export import hf_config
from model import MiniMindConfig, MiniMindForCausalLM
from trainer.diagnostics import flops_per_token, peak_flops
from trainer.optim import build_optimizer
from trainer.runtime import autocast, pick_device, resolve_dtype

MODES = ("eager", "compiled")


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


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--hidden_size", type=positive_int, default=512, help="width (512: MiniMind2-small)")
    p.add_argument("--num_hidden_layers", type=positive_int, default=8, help="number of blocks")
    p.add_argument("--batch_size", type=positive_int, default=4, help="sequences per step")
    p.add_argument("--seq_len", type=positive_int, default=256, help="tokens per sequence")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps per timed round")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed rounds per row (alternating)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="eager, compiled or both")
    p.add_argument("--json", type=Path, help="also write the flags, the machine and every row to this file")
    args = p.parse_args(argv)
    heads = MiniMindConfig().num_attention_heads  # MiniMind2's heads; RoPE needs even head widths
    if args.hidden_size % (2 * heads):
        raise UserError(f"--hidden_size must be a multiple of {2 * heads} ({heads} attention heads, each of "
                        f"an even width for rotary embeddings), got {args.hidden_size}")
    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    mixed_precision = autocast(device, dtype)

    torch.manual_seed(0)
    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers)
    minimind = MiniMindForCausalLM(config).to(device).train()
    llama = LlamaForCausalLM(hf_config(config, "llama")).to(device).train()
    llama.load_state_dict(minimind.state_dict())
    window = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
    x, y = window[:, :-1], window[:, 1:]

    rows = {}  # (model, mode) -> {"step": callable, "first_s": its first step's seconds, "times": per round}
    for mode in args.modes:
        for name, base in (("minimind", minimind), ("llama", llama)):
            model = copy.deepcopy(base)
            opt = build_optimizer(model, lr=1e-4, weight_decay=0.1)  # the trainer's optimizer, for every row
            run = torch.compile(model) if mode == "compiled" else model
            step = make_step(run, opt, x, y, mixed_precision, name == "minimind")
            print(f"first step: {name} {mode}", file=sys.stderr, flush=True)
            rows[name, mode] = {"step": step, "first_s": time_round(step, 1, device), "times": []}
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for row in rows.values():
            row["times"].append(time_round(row["step"], args.steps, device))

    tokens = args.batch_size * args.seq_len
    n_params = sum(p.numel() for p in minimind.parameters())
    peak = peak_flops(device, dtype)
    per_token = flops_per_token(n_params, config.num_hidden_layers, config.hidden_size, args.seq_len)
    step_flops = tokens * per_token
    results = []
    for (name, mode), row in rows.items():
        s_per_step = statistics.median(row["times"]) / args.steps
        results.append({"model": name, "mode": mode, "tokens_per_s": tokens / s_per_step,
                        "s_per_step": s_per_step,
                        "compile_s": row["first_s"] - s_per_step if mode == "compiled" else None,
                        "mfu": step_flops / s_per_step / peak if peak else None})
    rate = {(r["model"], r["mode"]): r["tokens_per_s"] for r in results}

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\n{n_params / 1e6:.2f}M params, batch {args.batch_size}x{args.seq_len}, {args.dtype}, "
          f"{device_name}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':<10}{'mode':<10}{'tokens/s':>12}{'s/step':>10}{'compile s':>11}{'MFU':>8}")
    for r in results:
        compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        print(f"{r['model']:<10}{r['mode']:<10}{r['tokens_per_s']:>12.0f}{r['s_per_step']:>10.3f}"
              f"{compile_s:>11}{mfu:>8}")
    for mode in args.modes:
        print(f"ratio minimind/llama {mode}: {rate['minimind', mode] / rate['llama', mode]:.3f}")
    if set(MODES) <= set(args.modes):
        print(f"compiled/eager minimind: {rate['minimind', 'compiled'] / rate['minimind', 'eager']:.3f}")
    if args.json:
        payload = {"environment": environment(device), "config": {**vars(args), "json": str(args.json)},
                   "num_params": n_params, "results": results}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(args.json, json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    run_cli(main)
