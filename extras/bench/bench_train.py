"""Training throughput of MiniMind vs transformers' LlamaForCausalLM of identical shape, eager and compiled;
or, with --norms, of MiniMind with each norm type (the speed claims of study/claims.json).

    python extras/bench/bench_train.py                  # MiniMind2-small shape (25.8M), fp32, CPU, both modes
    python extras/bench/bench_train.py --device cuda --dtype bfloat16 --batch_size 32 --seq_len 512
    python extras/bench/bench_train.py --modes eager    # no torch.compile (minutes of compiling on 2 cores)
    python extras/bench/bench_train.py --norms rmsnorm layernorm --hidden_size 128 --batch_size 8 \
        --rounds 10 --timings docs/results/speed    # the CPU default model: RMSNorm against LayerNorm

One step = forward + backward + AdamW step (the trainer's optimizer) on the same random batch for every row;
both models hold identical weights and each mode gets its own copies ("compiled" is torch.compile, as the
trainer's --compile). A row's first step is timed apart (for a compiled row, minus a steady step, it is the
compile time); then rounds alternate over all rows (every other round in reverse order) so that a noisy
machine slows them alike, and each row's figure is its median round. Ratio MiniMind / Llama per mode:
> 1, MiniMind is faster. MFU where the device's peak is known (trainer/diagnostics.py).
docs/performance.md has a run and its reading.

--norms puts MiniMind with each norm type (Pre-Norm) in the Llama row's place, all from one seed; --timings
DIR writes each mode's seconds per step, round by round, to DIR/<mode>/timings.json, where
scripts/write_claims.py pairs the rounds (interleaved, so a round of one norm type and the same round of
another met the same machine) and judges the ratio by the claims' rule.
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
from model.norms import NORM_TYPES
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


def build_models(config: MiniMindConfig, norms: list[str] | None, device) -> dict:
    """The rows' models, by name, with the same initial weights: MiniMind and a LlamaForCausalLM holding
    its weights; or, with norms, MiniMind with each norm type (pre-<norm>), each built from seed 0."""
    if norms:
        models = {}
        for norm in norms:
            torch.manual_seed(0)
            norm_config = MiniMindConfig(**{**config.to_dict(), "norm_type": norm})
            models[f"pre-{norm}"] = MiniMindForCausalLM(norm_config).to(device).train()
        return models
    torch.manual_seed(0)
    minimind = MiniMindForCausalLM(config).to(device).train()
    llama = LlamaForCausalLM(hf_config(config, "llama")).to(device).train()
    llama.load_state_dict(minimind.state_dict())
    return {"minimind": minimind, "llama": llama}


def write_timings(args, rows: dict, machine: dict, config: MiniMindConfig, device_name: str) -> None:
    """Each mode's seconds per step of every row, round by round, with what was timed and where (the
    CPU type, or the GPU's name: the claims' rule pairs rounds of one device only)."""
    for mode in args.modes:
        timings = {"seconds_per_step": {name: [t / args.steps for t in row["times"]]
                                        for (name, row_mode), row in rows.items() if row_mode == mode},
                   "mode": mode, "cpu": machine["cpu"] if device_name == "cpu" else device_name,
                   "threads": torch.get_num_threads(), "steps": args.steps, "rounds": args.rounds,
                   "batch_size": args.batch_size, "seq_len": args.seq_len, "dtype": args.dtype,
                   "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
                   "head_dim": config.hidden_size // config.num_attention_heads,
                   "environment": machine, "command": " ".join(["python extras/bench/bench_train.py",
                                                                *sys.argv[1:]])}
        path = args.timings / mode / "timings.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(timings, indent=1) + "\n")
        print(f"wrote {path}")


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
    p.add_argument("--norms", nargs="+", choices=sorted(t for t in NORM_TYPES if t != "none"),
                   help="time MiniMind with each of these norm types instead of against Llama")
    p.add_argument("--timings", type=Path, metavar="DIR", help="with --norms: write each mode's seconds per "
                   "step, round by round, to DIR/<mode>/timings.json (the speed claims' folders)")
    args = p.parse_args(argv)
    if args.timings and not args.norms:
        raise UserError("--timings records the rounds of a --norms comparison: give --norms too")
    heads = MiniMindConfig().num_attention_heads  # MiniMind2's heads; RoPE needs even head widths
    if args.hidden_size % (2 * heads):
        raise UserError(f"--hidden_size must be a multiple of {2 * heads} ({heads} attention heads, each of "
                        f"an even width for rotary embeddings), got {args.hidden_size}")
    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    mixed_precision = autocast(device, dtype)

    config = MiniMindConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers)
    models = build_models(config, args.norms, device)
    minimind = next(iter(models.values()))
    window = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
    x, y = window[:, :-1], window[:, 1:]

    rows = {}  # (model, mode) -> {"step": callable, "first_s": its first step's seconds, "times": per round}
    for mode in args.modes:
        for name, base in models.items():
            model = copy.deepcopy(base)
            opt = build_optimizer(model, lr=1e-4, weight_decay=0.1)  # the trainer's optimizer, for every row
            run = torch.compile(model) if mode == "compiled" else model
            step = make_step(run, opt, x, y, mixed_precision, name != "llama")
            print(f"first step: {name} {mode}", file=sys.stderr, flush=True)
            rows[name, mode] = {"step": step, "first_s": time_round(step, 1, device), "times": []}
    for round_index in tqdm(range(args.rounds), desc="rounds"):
        # every other round in reverse: no row always runs first, or always after the same one
        order = list(rows.values()) if round_index % 2 == 0 else list(reversed(rows.values()))
        for row in order:
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
    width = max(10, *(len(name) + 1 for name in models))
    print(f"{'model':<{width}}{'mode':<10}{'tokens/s':>12}{'s/step':>10}{'compile s':>11}{'MFU':>8}")
    for r in results:
        compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        print(f"{r['model']:<{width}}{r['mode']:<10}{r['tokens_per_s']:>12.0f}{r['s_per_step']:>10.3f}"
              f"{compile_s:>11}{mfu:>8}")
    first, second = list(models)[:2]
    for mode in args.modes:
        print(f"ratio {first}/{second} {mode}: {rate[first, mode] / rate[second, mode]:.3f}")
    if set(MODES) <= set(args.modes):
        print(f"compiled/eager {first}: {rate[first, 'compiled'] / rate[first, 'eager']:.3f}")
    if args.timings:
        write_timings(args, rows, environment(device), config, device_name)
    if args.json:
        payload = {"environment": environment(device), "config": {**vars(args), "json": str(args.json)},
                   "num_params": n_params, "results": results}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(args.json, json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    run_cli(main)
