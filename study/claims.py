"""Every claim the README and docs/results/ make, computed from the committed runs by one rule.

The claims are data (study/claims.json): for each, the variant, the baseline it is compared with, the
study folders that test it, the one among them whose result is the claim's verdict (its primary
folder), the outcome its authors expect and, for a study still training, the fresh seeds its read-out
planned. A difference is taken in one folder at a time, on the
fresh seeds (those that took no part in choosing either side's lr); RULE below turns the primary
folders' differences into verdicts, and nothing else states one.
"""

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from common.cli import UserError
from study import lr_tuning
from trainer.tracking import read_metrics

CLAIMS = Path(__file__).with_name("claims.json")
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
ALPHA, MIN_SEEDS, CLOSE = 0.01, 5, 0.02
CONFIDENCE = 1 - 2 * ALPHA  # the CI shown: inside ±CLOSE exactly when both one-sided tests pass
RULE = (
    "Each claim is judged in its primary folder only; its other folders show their statistics and no "
    "verdict. Δ is variant − baseline on each fresh seed (the tune seeds chose the lr and never count), "
    "paired on one CPU type and one batch order; pairs from several CPU types are analysed as blocks "
    f"(each type's mean, the variance pooled within types, df = n − types). *behind* / *ahead*: "
    f"n ≥ {MIN_SEEDS} and the t-test's p, adjusted by Holm over every primary test with n ≥ "
    f"{MIN_SEEDS}, is below {ALPHA}; *closes*: n ≥ {MIN_SEEDS} and both one-sided tests against "
    f"±{CLOSE} nats give p < {ALPHA} (the {CONFIDENCE:.0%} CI lies inside ±{CLOSE}); *open* "
    "otherwise; *does not train*: no lr tried trains the variant on its tune seeds. A seed where "
    "either side diverged or plateaued is a failure: counted (k of n failed) and left out of Δ, so n "
    "counts the pairs where both trained; a side that failed on a seed is never called the better "
    "one (a variant that failed: never ahead or closing; a baseline that failed: the variant never "
    "behind). A change of a gap from one folder to another is the later Δ minus the earlier, seed by "
    "seed, by the same rule: *grows* (above 0), *shrinks* (below 0), *holds* or *open*. A speed "
    "claim's Δ is the log of the ratio of step times, repeat by repeat, and "
    f"±{CLOSE} is then ±{CLOSE:.0%} of the time. A claim whose read-out planned n is *interim* "
    "until its primary folder holds n fresh seeds: no verdict, and no part in Holm's adjustment."
)
TREND = {"behind": "grows", "ahead": "shrinks", "closes": "holds"}  # a gap's change, by RULE
# What a run's record says of its batch order; runs before the order was recorded drew random windows
RANDOM_WINDOWS = "random windows"


@dataclass(frozen=True)
class Side:
    """One variant in one folder: its tuning.json record (None in a folder without one) and its runs
    there."""
    record: dict | None
    runs: list[dict]


@dataclass(frozen=True)
class Stats:
    """A paired difference over n pairs in blocks (CPU types): its mean, the SD pooled within the
    blocks, df = n − blocks, the CONFIDENCE interval, the two-sided t-test's p, and the larger p of
    the two one-sided tests against ±CLOSE (below ALPHA: the interval lies inside ±CLOSE). None where
    df < 1 leaves no spread to test against."""
    n: int
    mean: float | None
    sd: float | None = None
    df: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p: float | None = None
    p_close: float | None = None


def one_sided_p(t: float, df: int) -> float:
    """P(T ≥ t) for Student's t with df degrees of freedom."""
    tail = lr_tuning.t_two_sided_p(t, df) / 2
    return tail if t >= 0 else 1 - tail


def blocked_stats(differences: dict, blocks: dict) -> Stats:
    """differences (key -> Δ) with each key's block (its CPU type): the mean over all pairs (each
    block's mean, weighted by its pairs), tested against the variance within blocks, df = n − blocks.
    One block is the plain paired t-test. Identical differences (SD 0) give p = 0 when their mean is
    not 0, p = 1 when it is."""
    values = list(differences.values())
    n, types = len(values), len({blocks[key] for key in differences})
    if n - types < 1:
        return Stats(n, statistics.mean(values) if values else None)
    mean, df = statistics.mean(values), n - types
    within = {}
    for key, value in differences.items():
        within.setdefault(blocks[key], []).append(value)
    squares = sum((v - statistics.mean(vs)) ** 2 for vs in within.values() for v in vs)
    sd = math.sqrt(squares / df)
    se = sd / math.sqrt(n)
    half = lr_tuning.t_critical(CONFIDENCE, df) * se
    if se == 0:
        return Stats(n, mean, sd, df, mean, mean, float(mean == 0), float(abs(mean) >= CLOSE))
    p = lr_tuning.t_two_sided_p(mean / se, df)
    p_close = max(one_sided_p((mean + CLOSE) / se, df), 1 - one_sided_p((mean - CLOSE) / se, df))
    return Stats(n, mean, sd, df, mean - half, mean + half, p, p_close)


def train_loss(run: dict) -> float | None:
    """The mean logged training loss over the last 10% of the run's steps (one batch's loss is too
    noisy)."""
    path = Path(run["out_dir"]) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} is missing: the train loss is read from it; restore it from git")
    records = read_metrics(path)
    last = [r["loss"] for r in records if r["split"] == "train" and r["step"] > 0.9 * run["max_steps"]]
    return statistics.mean(last) if last else None


def cpu_type(run: dict) -> tuple[str | None, str | None]:
    """A run's CPU model and the kernels torch ran on it (AVX2, AVX512, ...): other kernels round
    float32 differently. Runs recorded before that listed the CPU's extensions; the widest is the
    same answer."""
    isa = run.get("environment", {}).get("cpu_isa") or []
    kernels = "AVX512" if {"AVX512", "AVX-512"} & set(isa) else (isa[-1] if isa else None)
    return run.get("environment", {}).get("cpu"), kernels


def batch_order(run: dict) -> str:
    return run.get("sampler", RANDOM_WINDOWS)


def failed(run: dict) -> bool:
    return bool(run["diverged"] or run.get("plateaued"))


def read_json(path: Path, advice: str = "restore it from git"):
    """A study file's content; a damaged one is one line naming it, with what to do (a committed
    folder's file comes back from git, a live run's is trained again)."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is damaged ({err}); {advice}") from None


def runs_of(folder: Path, variant: str) -> list[dict]:
    """Every finished run of a variant in a study folder, each with out_dir where it is now."""
    runs = []
    for run_dir in sorted(p for p in (folder / "runs").glob("*") if p.is_dir()):
        summary = run_dir / "summary.json"
        run = read_json(summary) if summary.is_file() else {"interrupted": True}
        # a stopped run writes its summary too, marked interrupted: its study's command resumes it
        if run.get("interrupted"):
            raise ValueError(f"{run_dir}: an unfinished run (finish it with its study's command, or "
                             "delete the folder)")
        run |= {"out_dir": str(run_dir)}
        if run["variant"] == variant:
            runs.append(run)
    return runs


def side(folder: Path, variant: str) -> Side:
    """The runs of a variant at the lr its folder chose (every run of it where the folder chose none,
    or trained it at one lr); none while its lr grid waits for a choice (runs at several lrs, or only on
    the tune seeds of a folder whose tuning.json has no record of it yet). A claim's folder holds one
    depth."""
    tuning = folder / "tuning.json"
    records = read_json(tuning) if tuning.is_file() else []
    record = next((t for t in records if t["variant"] == variant), None)
    runs = runs_of(folder, variant)
    tune_seeds = {seed for t in records for seed in t.get("tune_seeds", [])}
    seeds = {r["seed"] for r in runs}
    lrs = {r["args"]["learning_rate"] for r in runs}
    # an lr grid still choosing: which lr counts is not decided
    if record is None and (len(lrs) > 1 or (len(tune_seeds) > 0 and seeds <= tune_seeds)):
        return Side(None, [])
    if record is not None and record["chosen_lr"] is not None:
        runs = [r for r in runs if r["args"]["learning_rate"] == record["chosen_lr"]]
    if len({r["args"]["num_hidden_layers"] for r in runs}) > 1:
        raise ValueError(f"{folder}: {variant} trained at several depths; a claim's folder holds one")
    return Side(record, runs)


def pairs(variant: Side, baseline: Side) -> list[tuple[dict, dict]]:
    """(variant run, baseline run) on each fresh seed both trained, on one CPU type and in one batch
    order (same seed: same init and batches; other CPUs' kernels round differently)."""
    tuned = {seed for s in (variant, baseline) if s.record for seed in s.record.get("tune_seeds", [0])}
    by_seed = {r["seed"]: r for r in baseline.runs}
    return [(r, by_seed[r["seed"]]) for r in sorted(variant.runs, key=lambda r: r["seed"])
            if r["seed"] in by_seed and r["seed"] not in tuned
            and cpu_type(r) == cpu_type(by_seed[r["seed"]])
            and batch_order(r) == batch_order(by_seed[r["seed"]])]


def verdict(stats: Stats, p_adjusted: float | None, variant_failed: int, baseline_failed: int) -> str:
    """RULE, applied to a primary folder's paired differences (variant − baseline)."""
    if stats.n < MIN_SEEDS or stats.p is None:
        return "open"
    if p_adjusted < ALPHA:
        if stats.mean > 0 and not baseline_failed:
            return "behind"
        if stats.mean < 0 and not variant_failed:
            return "ahead"
    if stats.p_close < ALPHA and not variant_failed:
        return "closes"
    return "open"


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values times (m − i), never below the one
    before it, at most 1; returned in the order given."""
    order = sorted(range(len(p_values)), key=p_values.__getitem__)
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def regime(runs: list[dict]) -> dict:
    """What a folder's numbers are about: optimizer, steps, tokens per parameter, epochs (nominal
    where the runs drew random windows), width, head size, depth, corpus and the CPU types."""
    args = runs[0]["args"]
    tokens = args["max_steps"] * args["batch_size"] * args["max_seq_len"] * args["accumulation_steps"]
    width = args["hidden_size"] or runs[0].get("hidden_size")
    return {"optimizer": args["optimizer"], "steps": args["max_steps"],
            "tokens_per_param": tokens / runs[0]["num_params"],
            "passes": tokens / runs[0]["data"]["train"]["num_tokens"] if "data" in runs[0] else None,
            "order": batch_order(runs[0]), "width": width,
            "head_dim": width // args["num_attention_heads"],
            "layers": args["num_hidden_layers"], "corpus": Path(args["data_path"] or "Shakespeare").stem,
            "cpus": ", ".join(sorted({f"{cpu} ({kernels})" if cpu else "not recorded"
                                      for cpu, kernels in map(cpu_type, runs)}))}


def gaps(fresh: list[tuple[dict, dict]]) -> dict[str, dict[int, float]]:
    """variant − baseline in val and in train loss, on each fresh pair (pairs()) where neither side
    failed."""
    trained = [(v, b) for v, b in fresh if not failed(v) and not failed(b)]
    return {"val": {v["seed"]: v["val_loss"] - b["val_loss"] for v, b in trained},
            "train": {v["seed"]: train_loss(v) - train_loss(b) for v, b in trained}}


def cpu_blocks(fresh: list[tuple[dict, ...]]) -> dict[int, tuple]:
    """Each pair's seed -> the CPU types it trained on (its block)."""
    return {runs[0]["seed"]: tuple(cpu_type(run) for run in runs) for runs in fresh}


def difference(variant: Side, baseline: Side) -> dict:
    """variant − baseline on the fresh seeds of one folder: the paired val- and train-loss
    statistics of the seeds both trained, how many seeds paired and how many of them failed, on
    which side, and whether the variant trains at all."""
    fresh = pairs(variant, baseline)
    by_seed, blocks = gaps(fresh), cpu_blocks(fresh)
    trains = (variant.record["chosen_lr"] is not None if variant.record
              else not all(map(failed, variant.runs)))
    return {"val": blocked_stats(by_seed["val"], blocks),
            "train": blocked_stats(by_seed["train"], blocks), "seeds": len(fresh),
            "failed": sum(failed(v) or failed(b) for v, b in fresh), "trains": trains,
            "variant_failed": sum(failed(v) for v, _ in fresh),
            "baseline_failed": sum(failed(b) for _, b in fresh)}


def compute(claim: dict, folder: str, results: Path = RESULTS) -> dict | None:
    """One claim in one folder, with the folder's regime; None where the folder holds no runs of the
    claim's variant and baseline yet. A claim with a baseline_folder takes its baseline there."""
    if "metric" in claim:
        return speed_row(claim, folder, results)
    variant = side(results / folder, claim["variant"])
    baseline = side(results / claim.get("baseline_folder", folder), claim["baseline"])
    if not variant.runs or not baseline.runs:
        return None
    both = variant.runs + baseline.runs
    return {**claim, "folder": folder, "primary": folder == claim["primary"],
            **difference(variant, baseline), **regime(both)}


def speed_row(claim: dict, folder: str, results: Path) -> dict | None:
    """A speed claim in one folder: folder/timings.json holds each variant's seconds per training step,
    repeat by repeat, measured interleaved on one machine (extras/bench/bench_train.py --norms
    --timings)."""
    path = results / folder / "timings.json"
    if not path.is_file():
        return None
    timings = read_json(path)
    times = [timings["seconds_per_step"][name] for name in (claim["variant"], claim["baseline"])]
    logs = {i: math.log(v / b) for i, (v, b) in enumerate(zip(*times, strict=True))}
    stats = blocked_stats(logs, dict.fromkeys(logs, timings["cpu"]))
    return {**claim, "folder": folder, "primary": folder == claim["primary"], "val": stats,
            "train": Stats(0, None), "seeds": len(logs), "failed": 0, "trains": True,
            "variant_failed": 0, "baseline_failed": 0, "optimizer": "—", "steps": timings["steps"],
            "tokens_per_param": None, "passes": None, "order": "—", "width": timings["hidden_size"],
            "head_dim": timings["head_dim"], "layers": timings["layers"], "corpus": "random tokens",
            "cpus": f"{timings['cpu']} ({timings['mode']}, {timings['threads']} threads)"}


def change(claim: dict, results: Path = RESULTS) -> dict:
    """A claim on how a gap changes from one folder to another (claim["change"]: [earlier, later]):
    the later folder's val and train gaps minus the earlier one's, seed by seed; the failures at
    either end are counted, each on its side, as in a folder's difference."""
    ends = [pairs(side(results / f, claim["variant"]), side(results / f, claim["baseline"]))
            for f in claim["change"]]
    before, after = (gaps(fresh) for fresh in ends)
    blocks = [cpu_blocks(fresh) for fresh in ends]
    failures = sum(failed(v) or failed(b) for fresh in ends for v, b in fresh)
    variant_failed = sum(failed(v) for fresh in ends for v, _ in fresh)
    baseline_failed = sum(failed(b) for fresh in ends for _, b in fresh)
    stats = {}
    for metric in ("val", "train"):
        seeds = sorted(before[metric].keys() & after[metric].keys())
        stats[metric] = blocked_stats({s: after[metric][s] - before[metric][s] for s in seeds},
                                      {s: (blocks[0][s], blocks[1][s]) for s in seeds})
    return {**claim, "folder": " → ".join(claim["change"]), "primary": True, **stats,
            "seeds": stats["val"].n, "failed": failures, "trains": True,
            "variant_failed": variant_failed, "baseline_failed": baseline_failed}


def lr_not_chosen(claim: dict, folder: Path) -> bool:
    """Whether the folder holds runs of the claim's variant, none of them counted yet: its lr grid's."""
    if "metric" in claim or not folder.is_dir() or side(folder, claim["variant"]).runs:
        return False
    return len(runs_of(folder, claim["variant"])) > 0


def not_run(claim: dict, tuning: bool = False) -> dict:
    """The row of a claim whose primary folder holds no runs yet, or (tuning) only its variant's lr
    grid, still choosing."""
    return {**claim, "folder": claim["primary"], "primary": True, "not_run": True, "val": Stats(0, None),
            "train": Stats(0, None), "seeds": 0, "failed": 0, "tuning": tuning}


def compute_all(results: Path = RESULTS, claims: list[dict] | None = None) -> list[dict]:
    """Every claim of claims.json in every folder it names that has runs, each row with its verdict:
    the primary rows' by RULE (Holm over those with n ≥ MIN_SEEDS and their planned seeds), None for
    the others."""
    rows = []
    for claim in json.loads(CLAIMS.read_text()) if claims is None else claims:
        if "change" in claim:
            row = change(claim, results)
            rows.append(row if row["val"].n else not_run(claim | {"primary": row["folder"]}))
            continue
        computed = [compute(claim, folder, results) for folder in claim["folders"]]
        if computed[0] is None:  # its primary folder, listed first, holds no runs yet, or a grid's
            computed[0] = not_run(claim, lr_not_chosen(claim, results / claim["primary"]))
        rows += [row for row in computed if row is not None]
    for row in rows:
        row["interim"] = row["primary"] and row["seeds"] < row.get("planned", 0)
    tested = [r for r in rows if r["primary"] and not r["interim"] and r["val"].n >= MIN_SEEDS
              and r["val"].p is not None]
    adjusted = dict(zip(map(id, tested), holm([r["val"].p for r in tested]), strict=True))
    for row in rows:
        row["p_holm"] = adjusted.get(id(row))
        row["verdict"] = None
        if not row["primary"] or row.get("not_run"):
            continue
        if not row["trains"]:
            row["verdict"] = "does not train"
            continue
        if row["interim"]:
            row["verdict"] = "interim"
            continue
        word = verdict(row["val"], row["p_holm"], row["variant_failed"], row["baseline_failed"])
        row["verdict"] = TREND.get(word, word) if "change" in row else word
    return rows


def lr_check(folder: str, source: str, results: Path = RESULTS) -> list[dict]:
    """The lr check: each variant of `folder` by the mean final val loss over its seeds at each lr
    (lr_tuning.grid_point: None where a seed failed), against the lr `source` chose, which *moves*
    when another lr beats it by more than CLOSE nats or failed."""
    checks = []
    for record in read_json(results / source / "tuning.json"):
        runs = runs_of(results / folder, record["variant"])
        lrs = sorted({r["args"]["learning_rate"] for r in runs})
        points = [lr_tuning.grid_point(lr, [lr_tuning.Point(lr, r["val_loss"], not failed(r))
                                            for r in runs if r["args"]["learning_rate"] == lr])
                  for lr in lrs]
        means = {p.lr: p.val_loss if p.usable else None for p in points}
        best = lr_tuning.choose_lr(points)
        if record["chosen_lr"] in means:  # the lr check trains the choice and its neighbours
            held = means[record["chosen_lr"]]
            moves = best is not None and (held is None or means[best] < held - CLOSE)
            checks.append({"variant": record["variant"], "chosen": record["chosen_lr"], "means": means,
                           "outcome": f"moves to {best:g}" if moves else "holds"})
    return checks


def seeds_needed(sd: float, effect: float, expected: str, tests: int, power: float = 0.8) -> int:
    """The fresh seeds RULE needs to reach the expected verdict with this power, for a true Δ of
    `effect` and a paired SD `sd`: *behind* / *ahead* at ALPHA / tests (Holm's first threshold, the
    strictest), *closes* by both one-sided tests at ALPHA. The usual t approximation: the smallest
    n ≥ MIN_SEEDS with t(1 − α', n − 1) + t(power', n − 1) ≤ margin · √n / sd."""
    if expected == "closes":  # power' splits between the two bounds when Δ is 0
        margin, alpha = CLOSE - abs(effect), ALPHA
        beta = (1 - power) / 2 if effect == 0 else 1 - power
    else:
        margin, alpha, beta = abs(effect), ALPHA / tests / 2, 1 - power
    if margin <= 0:
        raise ValueError(f"no n reaches *{expected}* for a true Δ of {effect:+.3f}")
    n = MIN_SEEDS
    while True:
        t_alpha = lr_tuning.t_critical(1 - 2 * alpha, n - 1)
        t_beta = lr_tuning.t_critical(1 - 2 * beta, n - 1)
        if t_alpha + t_beta <= margin * math.sqrt(n) / sd:
            return n
        n += 1


def p_text(p: float) -> str:
    """A p-value as the pages print it. t_two_sided_p loses p near the float's precision to its subtraction
    (it returns 0 below about 1e-16), so a tiny p is shown as a bound, which holds after Holm's factor too."""
    return "< 1e-10" if p < 1e-10 else f"{p:.2g}"


def cell(s: Stats) -> str:
    """A paired difference as 'mean [CI], p' ('—' with no pair; no CI or p without a df)."""
    if s.mean is None or not math.isfinite(s.mean):
        return "—"
    if s.p is None:
        return f"{s.mean:+.3f}"
    return f"{s.mean:+.3f} [{s.ci_low:+.3f}, {s.ci_high:+.3f}], p {p_text(s.p)}"
