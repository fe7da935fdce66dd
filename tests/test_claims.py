"""study/claims.py's rule on hand-made study folders, and scripts/write_claims.py: the README's claims table,
docs/results/claims.md and claims.csv are what the committed runs give."""

import json

import pytest

from scripts import write_claims
from study import claims

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": ["AVX2", "AVX-512", "AMX"]}


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
               "max_steps": 100, "args": args, "num_params": 2e6, "hidden_size": 128, "environment": cpu,
               "data": {"train": {"num_tokens": 204_800}}}
    (run / "summary.json").write_text(json.dumps(summary))
    last = loss - 0.5 if train is None else train
    metrics = [{"step": step, "split": "train", "loss": loss + 1.0 if step <= 90 else last}
               for step in range(10, 101, 10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


def study(folder, gaps: dict[int, float], chosen=4e-3, failed=(), other_cpu=(), train_gaps=None) -> dict:
    """pre-rmsnorm and post-rmsnorm on seeds 0, 1 (tune seeds: their gaps are 9.0, and must never count)
    and the seeds of gaps (the train loss's gaps are train_gaps where given); the verdict of post against
    pre."""
    tuning = [{"variant": v, "depth": 8, "chosen_lr": lr, "tune_seeds": [0, 1]}
              for v, lr in (("pre-rmsnorm", 4e-3), ("post-rmsnorm", chosen))]
    folder.mkdir(parents=True)
    (folder / "tuning.json").write_text(json.dumps(tuning))
    for seed, gap in {0: 9.0, 1: 9.0, **gaps}.items():
        write_run(folder, "pre-rmsnorm", seed, 4.0 + seed / 100)
        cpu = {**XEON, "cpu_isa": ["AVX2"]} if seed in other_cpu else XEON
        train = 3.5 + seed / 100 + (train_gaps or {}).get(seed, gap)
        write_run(folder, "post-rmsnorm", seed, 4.0 + seed / 100 + gap, seed in failed, cpu, train)
    claim = {"claim": "Post-LN is worse", "variant": "post-rmsnorm", "baseline": "pre-rmsnorm",
             "expected": "behind"}
    return claims.compute(claim, folder.name, folder.parent)


GAPS = {2: 0.10, 3: 0.11, 4: 0.09, 5: 0.10, 6: 0.12}


def test_behind_needs_p_below_001_on_five_fresh_seeds(tmp_path):
    five = study(tmp_path / "five", GAPS)
    assert five["verdict"] == "behind" and five["seeds"] == 5 and five["failed"] == 0
    assert five["val"].mean == pytest.approx(0.104) and five["val"].p < 0.01
    assert five["train"].mean == pytest.approx(0.104)  # the last 10% of steps, the same gaps
    four = study(tmp_path / "four", dict(list(GAPS.items())[:4]))
    assert four["val"].p < 0.01 and four["verdict"] == "open"
    ahead = study(tmp_path / "ahead", {seed: -gap for seed, gap in GAPS.items()})
    assert ahead["verdict"] == "ahead"
    # the regime beside it: 100 steps of 2,048 tokens, 2M parameters, 204,800 training tokens
    assert (five["tokens_per_param"], five["passes"], five["head_dim"]) == (0.1024, 1.0, 16)


def test_a_gap_closes_when_its_ci_lies_within_002_nats(tmp_path):
    assert study(tmp_path / "level", {2: 0.001, 3: -0.002, 4: 0.0})["verdict"] == "closes"
    assert study(tmp_path / "wide", {2: 0.01, 3: -0.02, 4: 0.03})["verdict"] == "open"


def test_a_failure_is_counted_and_never_reads_as_ahead(tmp_path):
    failing = study(tmp_path / "failing", {**{seed: -gap for seed, gap in GAPS.items()}, 7: -0.1}, failed={7})
    assert (failing["seeds"], failing["failed"], failing["val"].n) == (6, 1, 5)
    assert failing["val"].p < 0.01 and failing["verdict"] == "open"
    assert study(tmp_path / "untrained", GAPS, chosen=None)["verdict"] == "not testable here"


def test_seeds_pair_only_on_one_cpu_type(tmp_path):
    mixed = study(tmp_path / "mixed", GAPS, other_cpu={2})
    assert mixed["seeds"] == 4 and mixed["verdict"] == "open"


def test_a_gap_shrinking_in_one_pass_reads_budget_and_only_on_val_after_it_repetition(tmp_path):
    noise = {2: 0.004, 3: -0.003, 4: 0.001, 5: -0.002, 6: 0.0, 7: 0.001}  # added again at each rung

    def reading(name: str, val: tuple, train: tuple, failed_at_760=()) -> str:
        """The reading of post against pre with these gaps at 400, 760 and 1,600 steps."""
        for i, folder in enumerate(claims.RUNGS):
            study(tmp_path / name / folder, {s: val[i] + i * e for s, e in noise.items()},
                  failed=failed_at_760 if i == 1 else (),
                  train_gaps={s: train[i] + i * e for s, e in noise.items()})
        claim = {"claim": "Post-LN is worse", "variant": "post-rmsnorm", "baseline": "pre-rmsnorm"}
        return claims.reading(claim, tmp_path / name)["reading"]

    assert reading("within one pass", (0.3, 0.15, 0.05), (0.3, 0.15, 0.1)) == "budget"
    assert reading("val after one pass", (0.2, 0.2, 0.1), (0.2, 0.2, 0.2)) == "repetition"
    assert reading("both after one pass", (0.2, 0.2, 0.1), (0.2, 0.2, 0.1)) == "open"
    assert reading("neither", (0.2, 0.2, 0.2), (0.2, 0.2, 0.2)) == "open"
    # a seed that failed at one rung is counted, and the change is at most open (five seeds remain)
    assert reading("a failure", (0.3, 0.15, 0.05), (0.3, 0.15, 0.1), failed_at_760={3}) == "open"
    claim = {"claim": "Post-LN is worse", "variant": "post-rmsnorm", "baseline": "pre-rmsnorm"}
    assert claims.reading(claim, tmp_path / "a failure")["changes"][0]["val"][1] == "open, 1 failed"


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


def test_the_readme_table_and_the_claims_page_are_what_the_committed_runs_give():
    with pytest.raises(SystemExit) as done:
        write_claims.main(["--check"])
    assert done.value.code == 0
