"""study/claims.py's rule on hand-made study folders, and scripts/write_claims.py: the README's claims table,
docs/results/claims.md and claims.csv are what the committed runs give."""

import json
import math
import random
import re
import statistics

import pytest

from scripts import write_claims
from study import claims, lr_tuning

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": ["AVX2", "AVX-512", "AMX"]}
EPYC = {"cpu": "AMD EPYC", "cpu_isa": ["AVX2", "AVX-512"]}


def write_run(folder, variant: str, seed: int, loss: float, failed: bool = False, cpu: dict = XEON,
              train: float | None = None, lr: float = 4e-3) -> None:
    """A finished run as the runner leaves it: its summary and its metrics (training loss `train` over the
    last steps, 0.5 below the validation loss unless given; 1.0 above it before)."""
    run = folder / "runs" / f"{variant}-lr{lr:g}-s{seed}"
    run.mkdir(parents=True)
    args = {"learning_rate": lr, "num_hidden_layers": 8, "optimizer": "adamw", "max_steps": 100,
            "batch_size": 8, "max_seq_len": 256, "accumulation_steps": 1, "num_attention_heads": 8,
            "hidden_size": 128, "data_path": None}
    summary = {"variant": variant, "seed": seed, "val_loss": loss, "diverged": False, "plateaued": failed,
               "interrupted": False, "max_steps": 100, "args": args, "num_params": 2e6, "hidden_size": 128,
               "environment": cpu, "data": {"train": {"num_tokens": 204_800}}}
    (run / "summary.json").write_text(json.dumps(summary))
    last = loss - 0.5 if train is None else train
    metrics = [{"step": step, "split": "train", "loss": loss + 1.0 if step <= 90 else last}
               for step in range(10, 101, 10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


def study(folder, gaps: dict[int, float], chosen=4e-3, failed=(), other_cpu=(), train_gaps=None,
          base_cpu=()) -> dict:
    """pre-rmsnorm and post-rmsnorm on seeds 0, 1 (tune seeds: their gaps are 9.0, and must never count)
    and the seeds of gaps (the train loss's gaps are train_gaps where given); the row of post against pre
    with the folder as the claim's primary. other_cpu: seeds whose post run trained on another CPU type;
    base_cpu: seeds whose both runs did."""
    tuning = [{"variant": v, "depth": 8, "chosen_lr": lr, "tune_seeds": [0, 1]}
              for v, lr in (("pre-rmsnorm", 4e-3), ("post-rmsnorm", chosen))]
    folder.mkdir(parents=True)
    (folder / "tuning.json").write_text(json.dumps(tuning))
    for seed, gap in {0: 9.0, 1: 9.0, **gaps}.items():
        both = EPYC if seed in base_cpu else XEON
        write_run(folder, "pre-rmsnorm", seed, 4.0 + seed / 100, cpu=both)
        cpu = {**XEON, "cpu_isa": ["AVX2"]} if seed in other_cpu else both
        train = 3.5 + seed / 100 + (train_gaps or {}).get(seed, gap)
        write_run(folder, "post-rmsnorm", seed, 4.0 + seed / 100 + gap, seed in failed, cpu, train)
    return judged(folder)[0]


def post_claim(folder, name: str = "Post-LN is worse") -> dict:
    return {"claim": name, "variant": "post-rmsnorm", "baseline": "pre-rmsnorm", "expected": "behind",
            "primary": folder.name, "folders": [folder.name]}


def judged(*folders, primary=True) -> list[dict]:
    """The rows of post against pre in each folder (one results folder), judged together: one claim per
    folder, each its primary folder (or none primary)."""
    claim_list = [post_claim(f, f"claim {i}") | ({} if primary else {"primary": None})
                  for i, f in enumerate(folders)]
    return claims.compute_all(folders[0].parent, claim_list)


GAPS = {2: 0.10, 3: 0.11, 4: 0.09, 5: 0.10, 6: 0.12}


def test_behind_needs_p_below_001_on_five_fresh_seeds(tmp_path):
    five = study(tmp_path / "five", GAPS)
    assert five["verdict"] == "behind" and five["seeds"] == 5 and five["failed"] == 0
    assert five["val"].mean == pytest.approx(0.104) and five["val"].p < 0.01
    assert five["p_holm"] == five["val"].p  # one primary test: Holm leaves it
    assert five["train"].mean == pytest.approx(0.104)  # the last 10% of steps, the same gaps
    four = study(tmp_path / "four", dict(list(GAPS.items())[:4]))
    assert four["val"].p < 0.01 and four["verdict"] == "open"
    ahead = study(tmp_path / "ahead", {seed: -gap for seed, gap in GAPS.items()})
    assert ahead["verdict"] == "ahead"
    # the regime beside it: 100 steps of 2,048 tokens, 2M parameters, 204,800 training tokens
    assert (five["tokens_per_param"], five["passes"], five["head_dim"]) == (0.1024, 1.0, 16)
    assert five["order"] == "random windows"  # these made runs record no order: an older version's


def test_holm_adjusts_each_p_over_every_primary_test_and_a_non_primary_folder_gives_no_verdict(tmp_path):
    near = {2: 0.02, 3: 0.05, 4: 0.015, 5: 0.04, 6: 0.03}  # t 4.85 at df 4: p 0.008
    alone = study(tmp_path / "alone" / "near", near)
    assert 0.005 < alone["val"].p < 0.01 and alone["verdict"] == "behind"
    study(tmp_path / "three" / "near", near)
    study(tmp_path / "three" / "nearer", {seed: gap + 0.002 for seed, gap in near.items()})
    study(tmp_path / "three" / "far", GAPS)
    rows = judged(*(tmp_path / "three" / name for name in ("near", "nearer", "far")))
    p = [row["val"].p for row in rows]
    assert p[2] < p[1] < p[0] < 0.01  # every test passes alone
    # Holm: the smallest p × 3, the next × 2 (never below the one before), the largest × 1
    assert [row["p_holm"] for row in rows] == pytest.approx([max(p[0], 2 * p[1]), 2 * p[1], 3 * p[2]])
    assert [row["verdict"] for row in rows] == ["open", "open", "behind"]
    shown = judged(tmp_path / "three" / "far", primary=False)[0]
    assert shown["verdict"] is None and shown["p_holm"] is None and shown["val"].p < 0.01
    assert claims.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_a_claim_is_interim_until_its_planned_seeds_are_in_and_holm_leaves_it_out(tmp_path):
    """A read-out's planned n: below it the row shows its statistics, no verdict and no Holm p, and
    the other primary tests are adjusted as if it were not there; at it, the rule speaks."""
    study(tmp_path / "results" / "landing", GAPS)
    study(tmp_path / "results" / "done", GAPS)
    folders = [tmp_path / "results" / name for name in ("landing", "done")]

    def rows(planned: int) -> list[dict]:
        claim_list = [post_claim(folders[0], "landing") | {"planned": planned}, post_claim(folders[1])]
        return claims.compute_all(tmp_path / "results", claim_list)
    landing, done = rows(planned=6)
    assert landing["verdict"] == "interim" and landing["p_holm"] is None and landing["val"].p < 0.01
    assert done["verdict"] == "behind" and done["p_holm"] == done["val"].p  # a family of one
    landing, done = rows(planned=5)
    assert landing["verdict"] == done["verdict"] == "behind"
    assert done["p_holm"] == pytest.approx(2 * min(landing["val"].p, done["val"].p))
    assert write_claims.verdict_cell(rows(planned=8)[0]) == "interim (5 of 8 seeds)"


def test_a_variant_whose_lr_grid_is_still_choosing_has_no_row_whatever_its_grid_holds(tmp_path):
    """A tuned folder (its tuning.json) where a variant's grid has no choice yet: no run of it counts, with
    one grid point in as with two, and the claim says its lr is not chosen yet, not that nothing ran."""
    folder = tmp_path / "results" / "tuned"
    study(folder, GAPS)
    claim = post_claim(folder) | {"variant": "pre-none", "planned": 6}
    cells = [write_claims.verdict_cell(claims.compute_all(tmp_path / "results", [claim])[0])]
    for lr in (1e-3, 2e-3):  # the grid's points land, seeds 0 and 1 each
        for seed in (0, 1):
            write_run(folder, "pre-none", seed, 5.0, lr=lr)
        cells.append(write_claims.verdict_cell(claims.compute_all(tmp_path / "results", [claim])[0]))
    assert cells == ["not run yet", "lr not chosen yet", "lr not chosen yet"]
    # a variant trained at one lr on fresh seeds, by an earlier command without a grid, counts
    fixed = tmp_path / "results" / "fixed"
    study(fixed, GAPS)
    for seed in range(7):
        write_run(fixed, "pre-none", seed, 5.0 + seed / 100, lr=1e-3)
    row = claims.compute_all(tmp_path / "results", [post_claim(fixed) | {"variant": "pre-none"}])[0]
    assert row["seeds"] == 5 and row["verdict"] == "behind"  # its fresh seeds 2-6 against pre's
    # a variant whose lr is settled but whose baseline has no runs: not run yet
    alone = post_claim(fixed) | {"variant": "pre-none", "baseline": "peri-rmsnorm"}
    assert write_claims.verdict_cell(claims.compute_all(tmp_path / "results", [alone])[0]) == "not run yet"


def test_each_planned_n_is_the_power_tables_where_a_pilot_gives_one():
    all_claims = json.loads(claims.CLAIMS.read_text())
    table = {row[0]: int(row[6]) for row in write_claims.power_rows(all_claims, {8: 1.0, 24: 1.0})}
    planned = {c["claim"]: c.get("planned") for c in all_claims if c["claim"] in table}
    assert planned == table and len(table) == 4


def test_a_gap_closes_when_both_one_sided_tests_pass_at_001_on_five_seeds(tmp_path):
    level = study(tmp_path / "level", {2: 0.001, 3: -0.002, 4: 0.0, 5: 0.002, 6: -0.001})
    assert level["verdict"] == "closes" and level["val"].p_close < 0.01
    assert level["val"].ci_low > -0.02 and level["val"].ci_high < 0.02  # the 98% CI, inside ±0.02
    assert study(tmp_path / "four", {2: 0.001, 3: -0.002, 4: 0.0, 5: 0.002})["verdict"] == "open"
    wide = study(tmp_path / "wide", {2: 0.01, 3: -0.02, 4: 0.03, 5: 0.0, 6: 0.015})
    assert wide["verdict"] == "open" and wide["val"].p_close > 0.01
    # a 95% CI would lie inside ±0.02 here; the 98% one, both one-sided tests at 0.01, does not
    edge = study(tmp_path / "edge", {2: -0.003, 3: 0.012, 4: 0.004, 5: 0.019, 6: 0.008})
    assert edge["val"].ci_high > 0.02 and edge["verdict"] == "open"
    half_95 = lr_tuning.t_critical(0.95, 4) * edge["val"].sd / math.sqrt(5)
    assert edge["val"].mean + half_95 < 0.02


def test_a_failure_is_counted_and_never_reads_as_ahead(tmp_path):
    failing = study(tmp_path / "failing", {**{seed: -gap for seed, gap in GAPS.items()}, 7: -0.1}, failed={7})
    assert (failing["seeds"], failing["failed"], failing["val"].n) == (6, 1, 5)
    assert failing["val"].p < 0.01 and failing["verdict"] == "open"
    assert study(tmp_path / "untrained", GAPS, chosen=None)["verdict"] == "does not train"


def test_seeds_pair_only_on_one_cpu_type_and_in_one_batch_order(tmp_path):
    mixed = study(tmp_path / "mixed", GAPS, other_cpu={2})
    assert mixed["seeds"] == 4 and mixed["verdict"] == "open"
    folder = tmp_path / "orders"
    study(folder, GAPS)
    summary_path = next(folder.glob("runs/post-rmsnorm-lr0.004-s3/summary.json"))
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps(summary | {"sampler": "epochs"}))  # the baseline drew random windows
    assert judged(folder)[0]["seeds"] == 4


def test_pairs_from_two_cpu_types_are_blocks_with_the_variance_pooled_within_types(tmp_path):
    gaps = {2: 0.10, 3: 0.12, 4: 0.11, 5: 0.20, 6: 0.22, 7: 0.21}  # seeds 5-7 both sides on the EPYC
    row = study(tmp_path / "blocks", gaps, base_cpu={5, 6, 7})
    stats = row["val"]
    assert (stats.n, stats.df) == (6, 4)
    assert stats.mean == pytest.approx(0.16)
    assert stats.sd == pytest.approx(0.01)  # within each type: (0.01² · 2 + 0.01² · 2) / 4
    assert stats.sd < statistics.stdev(gaps.values()) / 4  # pooled as one sample it would be 0.055


def test_a_change_of_a_gap_between_two_folders_is_judged_seed_by_seed(tmp_path):
    noise = {2: 0.004, 3: -0.003, 4: 0.001, 5: -0.002, 6: 0.0}
    study(tmp_path / "L8", {s: 0.1 + e for s, e in noise.items()})
    study(tmp_path / "L24", {s: 0.3 + 2 * e for s, e in noise.items()})
    study(tmp_path / "L24-same", {s: 0.1 + 2 * e for s, e in noise.items()})
    claim = {"claim": "the gap grows", "variant": "post-rmsnorm", "baseline": "pre-rmsnorm",
             "expected": "grows"}
    grows, holds = claims.compute_all(tmp_path, [claim | {"change": ["L8", "L24"]},
                                                 claim | {"change": ["L8", "L24-same"]}])
    assert grows["verdict"] == "grows" and grows["val"].mean == pytest.approx(0.2)
    assert holds["verdict"] == "holds" and grows["folder"] == "L8 → L24"
    study(tmp_path / "L24-failed", {s: 0.3 + 2 * e for s, e in noise.items()} | {7: 0.3}, failed={7})
    study(tmp_path / "L8-7", {s: 0.1 + e for s, e in noise.items()} | {7: 0.1})
    # a seed where the variant failed is counted and left out; it blocks only a verdict in its favour
    failed = claims.compute_all(tmp_path, [claim | {"change": ["L8-7", "L24-failed"]}])[0]
    assert (failed["failed"], failed["seeds"], failed["verdict"]) == (1, 5, "grows")
    shrinking = claims.compute_all(tmp_path, [claim | {"change": ["L24-failed", "L8-7"]}])[0]
    assert shrinking["val"].mean < 0 and shrinking["verdict"] == "open"  # not *shrinks*: it failed


def test_a_speed_claim_judges_the_log_ratio_of_interleaved_step_times(tmp_path):
    folder = tmp_path / "speed"
    folder.mkdir()
    timings = {"seconds_per_step": {"pre-rmsnorm": [0.50, 0.52, 0.49, 0.51, 0.50],
                                    "pre-layernorm": [0.55, 0.57, 0.54, 0.56, 0.55]},
               "cpu": "AMD EPYC", "mode": "eager", "threads": 2, "steps": 3, "hidden_size": 128,
               "head_dim": 16, "layers": 8}
    (folder / "timings.json").write_text(json.dumps(timings))
    claim = {"claim": "RMSNorm is faster", "variant": "pre-rmsnorm", "baseline": "pre-layernorm",
             "expected": "ahead", "metric": "seconds per step", "primary": "speed", "folders": ["speed"]}
    row = claims.compute_all(tmp_path, [claim])[0]
    assert row["verdict"] == "ahead" and row["val"].mean == pytest.approx(math.log(0.504 / 0.554), abs=2e-3)
    # a GPU's repeats barely vary: p falls below what the t distribution's closed form resolves (it gives 0)
    steps = timings["seconds_per_step"]
    steps["pre-layernorm"] = [1.2 * t for t in steps["pre-rmsnorm"]]
    steps["pre-layernorm"][0] *= 1.0001
    (folder / "timings.json").write_text(json.dumps(timings))
    row = claims.compute_all(tmp_path, [claim])[0]
    assert row["val"].p < 1e-10 and claims.cell(row["val"]).endswith("p < 1e-10")
    assert write_claims.p_holm(row) == "< 1e-10"


@pytest.mark.slow  # 4,000 simulated studies
def test_the_seeds_needed_give_the_power_asked_for():
    """Simulated paired studies at the n seeds_needed returns reach the verdict about 80% of the time,
    and with two seeds fewer clearly less often."""
    rng = random.Random(0)

    def power(n: int, effect: float, sd: float, expected: str, tests: int) -> float:
        hits = 0
        for _ in range(1000):
            diffs = {i: rng.gauss(effect, sd) for i in range(n)}
            stats = claims.blocked_stats(diffs, dict.fromkeys(diffs, "cpu"))
            if expected == "closes":
                hits += stats.p_close < claims.ALPHA
            else:
                hits += stats.p * tests < claims.ALPHA and stats.mean > 0
        return hits / 1000

    for effect, sd, expected, tests in [(0.0074, 0.021, "closes", 1), (0.1, 0.08, "behind", 10)]:
        n = claims.seeds_needed(sd, effect, expected, tests)
        assert n > claims.MIN_SEEDS + 2
        assert power(n, effect, sd, expected, tests) > 0.76
        assert power(n - 2, effect, sd, expected, tests) < 0.78
    assert claims.seeds_needed(0.044, 0.22, "behind", 1) == claims.MIN_SEEDS  # a large effect: the floor
    with pytest.raises(ValueError, match="no n reaches"):
        claims.seeds_needed(0.02, 0.03, "closes", 1)


def test_the_lr_check_moves_a_choice_only_when_another_lr_is_better_by_more_than_002_nats(tmp_path):
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "tuning.json").write_text(json.dumps(
        [{"variant": v, "chosen_lr": 4e-3} for v in ("pre-rmsnorm", "post-rmsnorm", "peri-rmsnorm", "mix")]))
    losses = {"pre-rmsnorm": {4e-3: 4.00, 8e-3: 3.99}, "post-rmsnorm": {2e-3: 4.00, 4e-3: 4.05, 8e-3: 3.90},
              "peri-rmsnorm": {4e-3: 4.00, 8e-3: 4.20}}
    for variant, by_lr in losses.items():
        for lr, loss in by_lr.items():
            for seed in (0, 1):  # post's 8e-3 plateaued on seed 1 and peri's 4e-3 on seed 0: they cannot win
                plateaued = (variant, lr, seed) in {("post-rmsnorm", 8e-3, 1), ("peri-rmsnorm", 4e-3, 0)}
                write_run(tmp_path / "long", variant, seed, loss + seed / 100, plateaued, lr=lr)
    checks = claims.lr_check("long", "short", tmp_path)  # mix trained no run here: no row
    assert [(c["variant"], c["outcome"]) for c in checks] == [
        ("pre-rmsnorm", "holds"), ("post-rmsnorm", "moves to 0.002"), ("peri-rmsnorm", "moves to 0.008")]
    assert checks[0]["means"] == {4e-3: pytest.approx(4.005), 8e-3: pytest.approx(3.995)}  # 0.01 better
    assert checks[1]["means"] == {2e-3: pytest.approx(4.005), 4e-3: pytest.approx(4.055), 8e-3: None}
    assert claims.lr_check("not run", "short", tmp_path) == []


@pytest.mark.parametrize("damage", ["cut summary", "cut tuning", "no metrics", "no summary", "stopped"])
def test_a_damaged_or_unfinished_study_file_is_one_line_naming_it(damage, tmp_path):
    study(tmp_path / "folder", GAPS)
    run = tmp_path / "folder" / "runs" / "post-rmsnorm-lr0.004-s3"
    damaged = {"cut summary": run / "summary.json", "cut tuning": tmp_path / "folder" / "tuning.json",
               "no metrics": run / "metrics.jsonl", "no summary": run / "summary.json",
               "stopped": run / "summary.json"}[damage]
    if damage.startswith("cut"):
        damaged.write_text(damaged.read_text()[:30])
    elif damage == "stopped":  # Ctrl-C: the summary of a run its study's command resumes
        damaged.write_text(json.dumps(json.loads(damaged.read_text()) | {"interrupted": True}))
    else:
        damaged.unlink()
    named = run if damage in ("no summary", "stopped") else damaged
    with pytest.raises(ValueError, match=re.escape(str(named))):
        judged(tmp_path / "folder")


def test_the_readme_table_and_the_claims_page_are_what_the_committed_runs_give():
    with pytest.raises(SystemExit) as done:
        write_claims.main(["--check"])
    assert done.value.code == 0
