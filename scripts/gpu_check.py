"""Every GPU check in one command, for a machine with a CUDA GPU: what it measured goes to one report.

    python scripts/gpu_check.py --out out/gpu_check

Runs tests/test_cuda.py, the default GPU pretraining eager and compiled (each followed by eval_llm.py
--eval_data), bench_train.py and bench_norms.py, each as its own process with its own time limit, most important
first, within --budget seconds in all (a step that no longer fits is skipped). OUT/gpu_check.md and .json are
rewritten after every step, so a run cut short still leaves a report; each step's output goes to OUT/logs/.
Without a usable CUDA GPU it exits at once with one line. The steps, and how to bring the wheels: docs/gpu.md.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from common.cli import ArgumentParser, UserError, run_cli
from trainer.args import DEVICE_DEFAULTS, build_parser
from trainer.tracking import read_metrics

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# the shape the default GPU run trains at: the CUDA preset's batch, --max_seq_len's default
PRESET_BATCH, PRESET_SEQ = DEVICE_DEFAULTS["cuda"]["batch_size"], build_parser().get_default("max_seq_len")


def pytest_numbers(stdout: str) -> dict:
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", stdout)}


def bench_numbers(path: Path) -> dict:
    return {"rows": json.loads(path.read_text()).get("results")} if path.is_file() else {}


def pretrain_numbers(run_dir: Path) -> dict:
    if not (run_dir / "summary.json").is_file():
        return {}
    summary = json.loads((run_dir / "summary.json").read_text())
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"]
    keys = ("step", "tokens_per_s", "s_per_step", "train_time_s", "compile_time_s", "train_loss", "val_loss",
            "val_bpb", "num_params")
    return {**{k: summary.get(k) for k in keys},
            "mfu_last_window": train[-1].get("mfu") if train else None,
            "peak_mem_mb": max((r["peak_mem_mb"] for r in train), default=None),
            "tokens_per_s_by_window": [r.get("tokens_per_s") for r in train]}


def eval_numbers(stdout: str) -> dict:
    """The metrics row eval_llm.py prints: ... loss ppl bpb."""
    rows = re.findall(r"(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s*$", stdout, re.MULTILINE)
    return dict(zip(("loss", "ppl", "bpb"), map(float, rows[-1]), strict=True)) if rows else {}


def steps(out: Path) -> list[tuple[str, list[str], int, object]]:
    """(name, command, seconds it may take at most, how to read its numbers), in the order they run."""
    train = [PY, "trainer/train_pretrain.py", "--device", "cuda", "--overwrite"]
    evaluate = [PY, "eval_llm.py", "--device", "cuda", "--eval_data"]
    return [
        ("tests/test_cuda.py", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"], 150,
         pytest_numbers),
        ("pretrain (eager)", [*train, "--out_dir", str(out / "pretrain-eager")], 150,
         lambda _: pretrain_numbers(out / "pretrain-eager")),
        ("eval_llm (eager run)", [*evaluate, "--model_path", str(out / "pretrain-eager")], 60, eval_numbers),
        ("bench_train", [PY, "scripts/bench_train.py", "--device", "cuda", "--dtype", "bfloat16", "--batch_size",
                         str(PRESET_BATCH), "--seq_len", str(PRESET_SEQ), "--steps", "5", "--rounds", "3",
                         "--json", str(out / "bench_train.json")], 200,
         lambda _: bench_numbers(out / "bench_train.json")),
        ("pretrain (--compile)", [*train, "--compile", "--out_dir", str(out / "pretrain-compiled")], 180,
         lambda _: pretrain_numbers(out / "pretrain-compiled")),
        ("eval_llm (compiled run)", [*evaluate, "--model_path", str(out / "pretrain-compiled")], 60, eval_numbers),
        ("bench_norms", [PY, "scripts/bench_norms.py", "--device", "cuda", "--tokens", str(PRESET_BATCH * PRESET_SEQ),
                         "--iters", "200", "--json", str(out / "bench_norms.json")], 90,
         lambda _: bench_numbers(out / "bench_norms.json")),
    ]


def machine() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "devices": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1), "capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def write_report(out: Path, report: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    m = report["machine"]
    lines = [f"# GPU check: {m['device']}", "",
             f"torch {m['torch']}, CUDA {m['cuda']}, cuDNN {m['cudnn']}, Python {m['python']}, {m['devices']} GPU(s) "
             f"of {m['memory_gib']} GiB, compute capability {m['capability']}; {m['date']}", "",
             "| step | status | seconds | numbers |", "|---|---|---|---|"]
    for step in report["steps"]:
        numbers = json.dumps(step.get("numbers", {}), separators=(", ", ": "))
        lines.append(f"| {step['name']} | {step['status']} | {step.get('seconds', '')} | {numbers} |")
    for step in report["steps"]:
        if step["status"] not in ("ok", "skipped"):
            lines += ["", f"## {step['name']}: {step['status']}", "", "```", " ".join(step["command"]),
                      step.get("output_tail", ""), "```"]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.md/.json, the runs and the logs")
    p.add_argument("--budget", type=float, default=480,
                   help="seconds for all the steps together (default 480: one 10-minute call, with time left to "
                        "install the wheels); a step that would not fit is skipped")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise UserError(f"no usable CUDA GPU here (torch {torch.__version__}, built for CUDA "
                        f"{torch.version.cuda or 'none'}); scripts/gpu_check.py measures the GPU path and needs one")
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "steps": []}
    deadline = time.monotonic() + args.budget
    for name, command, limit, read in steps(out):
        step = {"name": name, "command": command}
        report["steps"].append(step)
        left = deadline - time.monotonic()
        if left < min(limit, 30):
            step["status"] = "skipped"
            step["numbers"] = {"reason": f"{left:.0f} s of --budget left"}
            continue
        start = time.monotonic()
        try:
            result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=min(limit, left))
            step["status"] = "ok" if result.returncode == 0 else f"exit {result.returncode}"
        except subprocess.TimeoutExpired as err:  # it carries what the command printed until then, as bytes
            result, step["status"] = err, f"timed out after {min(limit, left):.0f} s"
        stdout, stderr = (t.decode() if isinstance(t, bytes) else t or "" for t in (result.stdout, result.stderr))
        output = stdout + stderr
        step["seconds"] = round(time.monotonic() - start, 1)
        step["numbers"] = read(stdout)
        step["output_tail"] = "\n".join(output.strip().splitlines()[-15:])
        (out / "logs" / (re.sub(r"\W+", "_", name).strip("_") + ".log")).write_text(output)
        write_report(out, report)
        print(f"{name}: {step['status']} in {step['seconds']} s", flush=True)
    write_report(out, report)
    print(f"wrote {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    if any(s["status"] not in ("ok", "skipped") for s in report["steps"]):
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main)
