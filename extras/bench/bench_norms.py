"""Time RMSNorm implementations against LayerNorm and a plain copy, at the model's activation shape.

    python extras/bench/bench_norms.py                      # 4*256 tokens x 512 hidden, fp32 and bf16
    python extras/bench/bench_norms.py --tokens 8192 --hidden 768 --dtypes fp32 --json out/norms.json
    python extras/bench/bench_norms.py --device cuda --dtypes fp32 bf16 fp16

Ops (each an nn.Module, so forward+backward also produces the weight gradients a training step needs):
  rms_norm          the model's RMSNorm formula (model/norms.py) left to autograd: the baseline
  F.rms_norm        the same output through torch.nn.functional.rms_norm (fused kernels on CUDA)
  hand-written      the same output with rmsnorm_kernels.py's hand-written backward
  layernorm         torch.nn.LayerNorm (one fused ATen kernel each way)
  compiled          torch.compile of rms_norm (compile time is reported separately)
  copy              x.clone(): the memory-bandwidth floor for a pass that reads and writes x once

"fwd" runs under torch.no_grad(); "fwd+bwd" runs torch.autograd.grad for the input and every parameter (no
.grad accumulation, which would add a pass).
"""

import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch import nn
from torch.utils import benchmark

from common.cli import ArgumentParser, positive_int, run_cli
from common.environment import environment
from common.fs import write_atomically
from extras.bench.rmsnorm_kernels import IMPLEMENTATIONS
from trainer.runtime import pick_device

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EPS = 1e-5
BLOCKS = 5  # each timing is the best of this many blocks of calls (see time_cases)


class WithWeight(nn.Module):
    """An RMSNorm with a weight, computed by one of rmsnorm_kernels.py's implementations."""

    def __init__(self, dim: int, implementation: str):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.implementation = IMPLEMENTATIONS[implementation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.implementation(x, self.weight, EPS)


class Copy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


OPS = {
    **{name: lambda dim, name=name: WithWeight(dim, name) for name in IMPLEMENTATIONS},
    "layernorm": lambda dim: nn.LayerNorm(dim, eps=EPS),
    "compiled": lambda dim: torch.compile(WithWeight(dim, "rms_norm")),
    "copy": lambda dim: Copy(),
}


def make_case(op: str, dtype: str, args) -> dict:
    """One (op, dtype) cell of the table: its two timers, and the cost of its first training call."""
    module = OPS[op](args.hidden).to(args.device, DTYPES[dtype])
    x = torch.randn(args.tokens, args.hidden, device=args.device, dtype=DTYPES[dtype], requires_grad=True)
    dy = torch.randn_like(x)
    wrt = [x, *module.parameters()]

    def fwd():
        with torch.no_grad():
            module(x)

    def fwd_bwd():
        torch.autograd.grad(module(x), wrt, dy)

    # The first training call is where torch.compile spends its time: reported, not hidden in a warm-up.
    start = time.perf_counter()
    fwd_bwd()
    if args.device == "cuda":
        torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    # Timer synchronizes CUDA around each block, so GPU times include the kernels. It defaults to one thread,
    # which would hide how the ops use the cores, so it gets torch's own thread count.
    timers = {t: benchmark.Timer("f()", globals={"f": f}, num_threads=torch.get_num_threads())
              for t, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd))}
    return {"op": op, "dtype": dtype, "timers": timers, "x_bytes": x.numel() * x.element_size(),
            "first_call_s": first_call_s}


def time_cases(cases: list[dict], iters: int) -> None:
    """Each timing is the best of BLOCKS blocks of iters // BLOCKS calls, after a warm-up block.

    The blocks go round-robin over all cases, so a burst of other work on a shared machine hits every case
    alike, and the best block, not the median, is kept: such noise only ever adds time.
    """
    block = max(1, iters // BLOCKS)
    for case in cases:
        for timer in case["timers"].values():
            timer.timeit(block)
    for i in range(BLOCKS):
        print(f"timing block {i + 1}/{BLOCKS}", file=sys.stderr, flush=True)
        for case in cases:
            for t, timer in case["timers"].items():
                ms = timer.timeit(block).mean * 1e3
                case[f"{t}_ms"] = min(ms, case.get(f"{t}_ms", ms))
    for case in cases:
        # The bytes a perfect kernel must move: a norm's forward reads x and writes y (2 passes), its backward
        # reads x and dy and writes dx (3 more); the copy's backward hands dy through, so it is 2 passes
        # either way. Weights and per-row statistics are O(hidden + tokens) and ignored.
        for t in ("fwd", "fwd_bwd"):
            passes = 5 if t == "fwd_bwd" and case["op"] != "copy" else 2
            case[f"{t}_gbps"] = passes * case["x_bytes"] / case[f"{t}_ms"] / 1e6


def add_ratios(rows: list[dict]) -> None:
    """time / LayerNorm's time and time / rms_norm's time, same dtype (< 1 means faster)."""
    for base, tag in (("layernorm", "layernorm"), ("rms_norm", "rms_norm")):
        ref = {r["dtype"]: r for r in rows if r["op"] == base}
        for r, t in itertools.product(rows, ("fwd", "fwd_bwd")):
            r[f"{t}_vs_{tag}"] = r[f"{t}_ms"] / ref[r["dtype"]][f"{t}_ms"] if r["dtype"] in ref else None


def print_results(rows: list[dict]) -> None:
    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print(f"{'op':<14}  {'dtype':<5}  {'fwd ms':>8}  {'fwd+bwd ms':>10}  {'fwd GB/s':>8}  {'f+b GB/s':>8}  "
          f"{'fwd/LN':>6}  {'f+b/LN':>6}  {'fwd/rms':>7}  {'f+b/rms':>7}")
    for r in rows:
        print(f"{r['op']:<14}  {r['dtype']:<5}  {r['fwd_ms']:>8.4f}  {r['fwd_bwd_ms']:>10.4f}  "
              f"{r['fwd_gbps']:>8.1f}  {r['fwd_bwd_gbps']:>8.1f}  "
              f"{ratio(r['fwd_vs_layernorm']):>6}  {ratio(r['fwd_bwd_vs_layernorm']):>6}  "
              f"{ratio(r['fwd_vs_rms_norm']):>7}  {ratio(r['fwd_bwd_vs_rms_norm']):>7}")
    for r in rows:
        if r["op"] == "compiled":
            print(f"compiled {r['dtype']}: first fwd+bwd call (compilation) took {r['first_call_s']:.1f} s")


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=positive_int, default=4 * 256, help="rows of the activation: batch * seq")
    p.add_argument("--hidden", type=positive_int, default=512, help="normalized dimension: the hidden_size")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"], help="input dtypes")
    p.add_argument("--ops", nargs="+", choices=list(OPS), default=list(OPS), help="what to time")
    p.add_argument("--iters", type=positive_int, default=500,
                   help=f"timed calls per measurement, split into {BLOCKS} blocks")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads (default: torch's own count); 1 is steadier on a shared machine")
    p.add_argument("--json", type=Path, help="also write the config and every row to this JSON file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = pick_device(args.device).type

    torch.manual_seed(0)
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else f"cpu ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads")
    print(f"torch {torch.__version__} | {device_name} | x: {args.tokens} x {args.hidden} | "
          f"iters {args.iters}")
    cases = []
    for dtype, op in itertools.product(args.dtypes, args.ops):
        print(f"[{len(cases) + 1}/{len(args.ops) * len(args.dtypes)}] first call: {op} {dtype}",
              file=sys.stderr, flush=True)
        cases.append(make_case(op, dtype, args))
    time_cases(cases, args.iters)
    rows = [{k: v for k, v in case.items() if k != "timers"} for case in cases]
    add_ratios(rows)
    print_results(rows)
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"} | {"device_name": device_name}
        payload = {"environment": environment(args.device), "config": config, "results": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(args.json, json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    run_cli(main)
