"""Every claim the README and docs/results/ make, computed from the committed runs by one rule.

The claims are data (study/claims.json): for each, the variant, the baseline it is compared with, the study
folders that test it, and the sign its authors expect. A verdict is taken in one folder at a time, on the
fresh seeds (those that took no part in choosing either side's lr), by RULE below; nothing else states one.
"""

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from study import lr_tuning
from trainer.tracking import read_metrics

CLAIMS = Path(__file__).with_name("claims.json")
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
ALPHA, MIN_SEEDS, CLOSE = 0.01, 5, 0.02
RULE = (f"*behind* / *ahead*: the paired t-test over the fresh seeds of one study folder gives p < {ALPHA} "
        f"with n ≥ {MIN_SEEDS}; *closes*: the 95% CI of the mean paired difference lies within "
        f"±{CLOSE} nats of 0; *open* otherwise; *not testable here*: the variant trained at no lr tried. "
        "A seed where either side diverged or plateaued is a failure: it is counted (k of n failed), and a "
        "variant that failed on a seed is never called ahead or closing. Tune seeds are never in a mean.")
# The budget study's rungs: 400 steps, one pass over the training tokens (760), two passes (1,600).
RUNGS = ("budget/adamw-400", "budget/adamw-760", "budget/adamw-1600")
TREND = {"behind": "grows", "ahead": "shrinks", "closes": "holds", "open": "open"}  # a gap's change, by RULE


@dataclass(frozen=True)
class Side:
    """One variant in one folder: its tuning.json record (None in a folder without one) and its runs there."""
    record: dict | None
    runs: list[dict]


def train_loss(run: dict) -> float | None:
    """The mean logged training loss over the last 10% of the run's steps (one batch's loss is too noisy)."""
    records = read_metrics(Path(run["out_dir"]) / "metrics.jsonl")
    last = [r["loss"] for r in records if r["split"] == "train" and r["step"] > 0.9 * run["max_steps"]]
    return statistics.mean(last) if last else None


def cpu_type(run: dict) -> tuple[str | None, str | None]:
    """A run's CPU model and the kernels torch ran on it (AVX2, AVX512, ...): other kernels round float32
    differently. Runs recorded before that listed the CPU's extensions; the widest is the same answer."""
    isa = run.get("environment", {}).get("cpu_isa") or []
    kernels = "AVX512" if {"AVX512", "AVX-512"} & set(isa) else (isa[-1] if isa else None)
    return run.get("environment", {}).get("cpu"), kernels


def failed(run: dict) -> bool:
    return bool(run["diverged"] or run.get("plateaued"))


def side(folder: Path, variant: str) -> Side:
    """The runs of a variant at the lr its folder chose (every run of it where the folder chose none, or
    has no tuning.json). A claim's folder holds one depth."""
    tuning = folder / "tuning.json"
    records = json.loads(tuning.read_text()) if tuning.is_file() else []
    record = next((t for t in records if t["variant"] == variant), None)
    runs = []
    for path in sorted(folder.glob("runs/*/summary.json")):
        run = json.loads(path.read_text()) | {"out_dir": str(path.parent)}
        chosen = record is None or record["chosen_lr"] in (None, run["args"]["learning_rate"])
        if run["variant"] == variant and chosen:
            runs.append(run)
    if len({r["args"]["num_hidden_layers"] for r in runs}) > 1:
        raise ValueError(f"{folder}: {variant} trained at several depths; a claim's folder holds one")
    return Side(record, runs)


def pairs(variant: Side, baseline: Side) -> list[tuple[dict, dict]]:
    """(variant run, baseline run) on each fresh seed both trained, on one CPU type (same seed: same init and
    batches; other CPUs' kernels round differently)."""
    tuned = {seed for s in (variant, baseline) if s.record for seed in s.record.get("tune_seeds", [0])}
    by_seed = {r["seed"]: r for r in baseline.runs}
    return [(r, by_seed[r["seed"]]) for r in sorted(variant.runs, key=lambda r: r["seed"])
            if r["seed"] in by_seed and r["seed"] not in tuned
            and cpu_type(r) == cpu_type(by_seed[r["seed"]])]


def verdict(stats: lr_tuning.Stats, variant_failed: int, baseline_failed: int, trains: bool) -> str:
    """RULE, applied to the paired val-loss differences (variant − baseline) of one folder."""
    if not trains:
        return "not testable here"
    if stats.p is not None and stats.p < ALPHA and stats.n >= MIN_SEEDS:
        if stats.mean > 0 and not baseline_failed:
            return "behind"
        if stats.mean < 0 and not variant_failed:
            return "ahead"
    if stats.ci_low is not None and stats.ci_low >= -CLOSE and stats.ci_high <= CLOSE and not variant_failed:
        return "closes"
    return "open"


def regime(runs: list[dict]) -> dict:
    """What a folder's numbers are about: optimizer, steps, tokens per parameter, passes over the data,
    width, head size, depth, corpus and the CPU types the runs trained on."""
    args = runs[0]["args"]
    tokens = args["max_steps"] * args["batch_size"] * args["max_seq_len"] * args["accumulation_steps"]
    return {"optimizer": args["optimizer"], "steps": args["max_steps"],
            "tokens_per_param": tokens / runs[0]["num_params"],
            "passes": tokens / runs[0]["data"]["train"]["num_tokens"] if "data" in runs[0] else None,
            "width": args["hidden_size"], "head_dim": args["hidden_size"] // args["num_attention_heads"],
            "layers": args["num_hidden_layers"], "corpus": Path(args["data_path"] or "Shakespeare").stem,
            "cpus": ", ".join(sorted({f"{cpu} ({kernels})" if cpu else "not recorded"
                                      for cpu, kernels in map(cpu_type, runs)}))}


def gaps(fresh: list[tuple[dict, dict]]) -> dict[str, dict[int, float]]:
    """variant − baseline in val and in train loss, on each fresh pair (pairs()) where neither side failed."""
    trained = [(v, b) for v, b in fresh if not failed(v) and not failed(b)]
    return {"val": {v["seed"]: v["val_loss"] - b["val_loss"] for v, b in trained},
            "train": {v["seed"]: train_loss(v) - train_loss(b) for v, b in trained}}


def difference(variant: Side, baseline: Side) -> dict:
    """variant − baseline on the fresh seeds of one folder: the paired val- and train-loss differences of the
    seeds both trained, how many seeds paired and how many of them failed, and the verdict."""
    fresh = pairs(variant, baseline)
    by_seed = gaps(fresh)
    val = lr_tuning.paired_stats(by_seed["val"])
    train = lr_tuning.paired_stats(by_seed["train"])
    trains = variant.record["chosen_lr"] is not None if variant.record else not all(map(failed, variant.runs))
    outcome = verdict(val, sum(failed(v) for v, _ in fresh), sum(failed(b) for _, b in fresh), trains)
    return {"val": val, "train": train, "seeds": len(fresh), "verdict": outcome,
            "failed": sum(failed(v) or failed(b) for v, b in fresh)}


def compute(claim: dict, folder: str, results: Path = RESULTS) -> dict | None:
    """One claim in one folder, with the folder's regime; None where the folder holds no runs of the claim's
    variant and baseline yet."""
    variant = side(results / folder, claim["variant"])
    baseline = side(results / folder, claim["baseline"])
    if not variant.runs or not baseline.runs:
        return None
    both = variant.runs + baseline.runs
    return {**claim, "folder": folder, **difference(variant, baseline), **regime(both)}


def compute_all(results: Path = RESULTS) -> list[dict]:
    """Every claim of claims.json in every folder it names that has runs."""
    rows = [compute(claim, folder, results) for claim in json.loads(CLAIMS.read_text())
            for folder in claim["folders"]]
    return [row for row in rows if row is not None]


def change(earlier: list[tuple[dict, dict]], later: list[tuple[dict, dict]]) -> dict:
    """The val and train gaps of a later rung's fresh pairs minus an earlier one's, seed by seed, judged by
    RULE (shrinks, grows, holds, open; a failure at either rung is counted and leaves at most *open*)."""
    before, after = gaps(earlier), gaps(later)
    failures = sum(failed(v) or failed(b) for v, b in [*earlier, *later])
    judged = {}
    for metric in ("val", "train"):
        seeds = sorted(before[metric].keys() & after[metric].keys())
        stats = lr_tuning.paired_stats({s: after[metric][s] - before[metric][s] for s in seeds})
        trend = TREND[verdict(stats, failures, failures, trains=True)]
        judged[metric] = stats, trend + (f", {failures} failed" if failures else "")
    return judged


def reading(claim: dict, results: Path = RESULTS) -> dict:
    """budget-readout.md's reading of a claim tested at every rung of RUNGS: *budget* when its val and train
    gaps both shrink within one pass, *repetition* when only the val gap shrinks in the second pass."""
    fresh = [pairs(side(results / folder, claim["variant"]), side(results / folder, claim["baseline"]))
             for folder in RUNGS]
    first = change(*fresh[:2])
    second = change(*fresh[1:])
    budget = first["val"][1] == first["train"][1] == "shrinks"
    repetition = second["val"][1] == "shrinks" and second["train"][1] in ("holds", "grows")
    outcome = "budget" if budget else "repetition" if repetition else "open"
    return {**claim, "changes": [first, second], "reading": outcome}


def lr_check(folder: str, source: str, results: Path = RESULTS) -> list[dict]:
    """budget-readout.md's lr check: each variant of `folder` by the mean final val loss over its seeds at
    each lr (lr_tuning.grid_point: None where a seed failed), against the lr `source` chose, which *moves*
    when another lr beats it by more than CLOSE nats or failed."""
    checks = []
    for record in json.loads((results / source / "tuning.json").read_text()):
        runs = side(results / folder, record["variant"]).runs
        lrs = sorted({r["args"]["learning_rate"] for r in runs})
        points = [lr_tuning.grid_point(lr, [lr_tuning.Point(lr, r["val_loss"], not failed(r))
                                            for r in runs if r["args"]["learning_rate"] == lr]) for lr in lrs]
        means = {p.lr: p.val_loss if p.usable else None for p in points}
        best = lr_tuning.choose_lr(points)
        if record["chosen_lr"] in means:  # the lr check trains the choice and its neighbours
            held = means[record["chosen_lr"]]
            moves = best is not None and (held is None or means[best] < held - CLOSE)
            checks.append({"variant": record["variant"], "chosen": record["chosen_lr"], "means": means,
                           "outcome": f"moves to {best:g}" if moves else "holds"})
    return checks


def cell(s: lr_tuning.Stats) -> str:
    """A paired difference as 'mean [95% CI], p' ('—' with no pair; no CI or p with one)."""
    if s.mean is None or not math.isfinite(s.mean):
        return "—"
    return f"{s.mean:+.3f}" + ("" if s.p is None else f" [{s.ci_low:+.3f}, {s.ci_high:+.3f}], p {s.p:.2g}")
