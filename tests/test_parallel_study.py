"""study/parallel.py and the ablation runner under torchrun: ranks train whole runs side by side, each run
exactly as the study without torchrun trains it, none twice, none lost when a rank is killed."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from common.cli import UserError
from common.environment import usable_cores
from scripts import run_ablation
from study import lr_tuning, parallel
from study.parallel import Worker, meet, train_in_parallel
from study.runner import own_share, tune_plan
from trainer.tracking import read_metrics

REPO = Path(__file__).resolve().parents[1]
COMPARED = ("step", "diverged", "train_loss", "val_loss", "val_bpb", "num_params", "seed", "variant")


class Store:
    """A stand-in for torchrun's store, for ranks that are threads: it records the waits they asked for."""

    def __init__(self):
        self.store, self.waits = torch.distributed.HashStore(), []

    def add(self, key, amount):
        return self.store.add(key, amount)

    def set(self, key, value):
        self.store.set(key, value)

    def wait(self, keys, timeout):
        self.waits.append(timeout)
        self.store.wait(keys, min(timeout, timedelta(seconds=30)))  # a rank that never comes fails the test


@pytest.fixture
def store(monkeypatch) -> Store:
    """Ranks that are threads meet through one Store, each counting its meetings from 0."""
    meetings = Store()
    monkeypatch.setattr(parallel, "study_store", lambda worker: meetings)
    monkeypatch.setattr(parallel, "MEETINGS", Counter())
    return meetings


@pytest.mark.parametrize("world_size", [2, 3])
def test_run_i_goes_to_rank_i_mod_world_size_and_the_ranks_replan_once_all_are_done(world_size, store):
    """A hand-made tuned study: grid runs g0..g4 (g1 finished before), then, once the grid is done, seed
    runs s0..s3. Ranks are threads; rank 1 is slow to make its first plan. Every rank trains run i of each
    plan when i % world_size is its rank, and each run once (a rank that planned late, or early, would
    train another's)."""
    done, trained, lock = {"g1"}, {rank: [] for rank in range(world_size)}, threading.Lock()
    grid, seeds = [f"g{i}" for i in range(5)], [f"s{i}" for i in range(4)]
    first_trained = threading.Event()

    def pending(rank):
        if rank == 1 and not trained[1]:
            first_trained.wait(0.5)  # another rank's run finished meanwhile would change this plan: none may
        with lock:
            grid_left = [run for run in grid if run not in done]
            return grid_left or [run for run in seeds if run not in done]

    def train(rank, run):
        with lock:
            trained[rank].append(run)
            done.add(run)
        first_trained.set()

    def rank(r):
        train_in_parallel(lambda: pending(r), lambda run: train(r, run), Worker(r, world_size), 2)

    with ThreadPoolExecutor(world_size) as pool:
        list(pool.map(rank, range(world_size)))  # (list: a rank's exception fails the test)
    rounds = [["g0", "g2", "g3", "g4"], seeds]  # g1 is reused, not trained: the first plan lists the others
    assert trained == {r: [run for plan in rounds for run in plan[r::world_size]] for r in range(world_size)}
    # each round: a meeting after planning (--dist_timeout) and one after training (no limit)
    assert sorted(set(store.waits)) == [timedelta(minutes=2), timedelta(days=365)]
    assert len(store.waits) == 2 * len(rounds) * world_size


def test_a_rank_that_waits_past_the_timeout_ends_in_one_line(store):
    with pytest.raises(UserError, match=r"^rank 1 waited past --dist_timeout for the others: .*timeout"):
        meet(Worker(rank=1, world_size=2), 0.001)


def test_a_worker_takes_its_own_share_and_hides_torchrun_from_the_trainer(monkeypatch):
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(name, value)  # (and restored after the test, whatever own_share sets)
    worker = Worker.from_environment()
    assert worker == Worker(rank=3, world_size=4, local_rank=1, local_world_size=2)
    threads = []
    monkeypatch.setattr("study.runner.usable_cores", lambda: 6)
    monkeypatch.setattr("study.runner.torch.set_num_threads", threads.append)  # this process keeps its own
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)  # (restored after the test: own_share replaces both)
    monkeypatch.setattr(sys, "stderr", err)
    own_share(worker, run_ablation.parse_args(["--device", "cpu"])[1])
    assert threads == [3]  # six cores, two ranks on this machine
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("1", "0", "0")
    print("=== a run", end="")
    print(", named", flush=True)
    sys.stderr.write("train: 10%\rtrain: 50%\rtrain: 100%\n")  # a progress bar: its last state, once
    assert out.getvalue() == "[rank 3] === a run, named\n" and err.getvalue() == "[rank 3] train: 100%\n"


def test_tuning_sends_every_grid_run_out_before_any_other_seed(monkeypatch):
    study, _ = run_ablation.parse_args(["--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1", "2",
                                        "--tune_lr", "1e-3", "2e-3", "4e-3"])
    point = lambda run: lr_tuning.Point(run[2], abs(run[2] - 2e-3), True)  # noqa: E731
    grid = {("pre-rmsnorm", 8, lr, study.warmup_steps[0], seed): {}
            for lr in (1e-3, 2e-3, 4e-3) for seed in (0, 1)}
    plan = tune_plan(study, grid, point, print)  # pre's grid is done, post's not started
    assert list(plan.pending.values()) == ["grid"] * 6 + ["seed"]
    assert list(plan.pending)[-1] == ("pre-rmsnorm", 8, 2e-3, study.warmup_steps[0], 2)
    assert [t["variant"] for t in plan.tuning] == ["pre-rmsnorm"] and plan.groups == {}


# ---------------------------------------------------------------------------------------------------------
# Under torchrun, in fresh processes, against the same study trained in this process without it


def torchrun(flags: list[str], env: dict, log: Path) -> subprocess.Popen:
    """The runner under torchrun on 2 ranks, its output into log (a pipe nobody reads while the test polls
    would fill up and stop the ranks)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(REPO / "scripts" / "run_ablation.py"), *flags]
    with open(log, "w") as out:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path) -> str:
    process.wait(timeout=600)
    return log.read_text()


def records(study: Path) -> dict[str, str]:
    """Each run's summary and metrics as written: a run trained again changes them."""
    return {f"{p.parent.name}/{p.name}": p.read_text() for p in sorted(study.glob("runs/*/*.json*"))}


def trained_once(study: Path) -> bool:
    """Every run's training steps logged once, in order: no run was trained twice, by one rank or two."""
    logs = [read_metrics(p) for p in study.glob("runs/*/metrics.jsonl")]
    steps = [[r["step"] for r in log if r["split"] == "train"] for log in logs]
    return all(s == sorted(set(s)) for s in steps)


def whole_lines(log: str) -> bool:
    """Every line a rank wrote is whole: one rank's text never runs into another's on one line."""
    return all(line.startswith("[rank ") and line.count("[rank ") == 1 for line in log.splitlines()
               if "[rank " in line)


@pytest.fixture
def runner(tmp_path, tiny_flags, monkeypatch):
    """(flags of a tiny study in folder `name`, torchrun's environment, the study trained in this process):
    one token cache for all, and the threads a rank gets for every run (a run's float arithmetic depends on
    them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(MINIMIND_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", HOME=str(tmp_path))
    monkeypatch.setenv("MINIMIND_CACHE", env["MINIMIND_CACHE"])

    def flags(name: str, *more: str) -> list[str]:
        return ["--out_dir", str(tmp_path / name), *tiny_flags, "--log_interval", "5", "--dist_timeout", "2",
                *more]

    def alone(name: str, *more: str) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, usable_cores() // 2))  # what each of torchrun's 2 ranks gets
        try:
            run_ablation.main(flags(name, *more))
        finally:
            torch.set_num_threads(threads)
    return flags, env, alone


def summaries(study: Path) -> dict[str, dict]:
    return {Path(r["out_dir"]).name: {k: r[k] for k in COMPARED}
            for r in json.loads((study / "results.json").read_text())}


def children(pid: int) -> list[int]:
    """The processes whose parent is pid (the field after the name in /proc/*/stat)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return [child for child, parent in parents.items() if parent == pid]


@pytest.mark.slow  # torchrun twice, and the same study in this process
def test_a_study_under_torchrun_trains_each_run_once_as_without_and_survives_a_killed_rank(runner, tmp_path):
    """2 variants x 2 seeds on 2 ranks, each run on one rank. A rank is killed once a run is finished and
    another has a checkpoint; the same command then finishes the study: the finished run is not trained again,
    the others resume, each run is in the results once, and every summary equals that of the study without
    torchrun, bit for bit (exact resume included)."""
    flags, env, alone = runner
    study = ("--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1", "--max_steps", "200",
             "--eval_interval", "100", "--save_interval", "40")
    folder = tmp_path / "ranks" / "runs"
    first = torchrun(flags("ranks", *study), env, tmp_path / "first.log")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        finished = {p.parent.name for p in folder.glob("*/summary.json")}
        started = {p.parent.name for p in folder.glob("*/step-*")} - finished
        if finished and started:
            break
        time.sleep(0.02)
    else:
        pytest.fail("no run finished while another was under way")
    os.kill(max(children(first.pid)), signal.SIGKILL)
    before = {name: text for name, text in records(tmp_path / "ranks").items()
              if name.split("/")[0] in finished}
    first_log = finish(first, tmp_path / "first.log")
    assert first.returncode != 0
    again = torchrun(flags("ranks", *study), env, tmp_path / "again.log")
    again_log = finish(again, tmp_path / "again.log")
    assert again.returncode == 0, again_log[-3000:]
    assert whole_lines(first_log) and whole_lines(again_log)
    # the finished runs are not trained again
    assert {name: records(tmp_path / "ranks")[name] for name in before} == before
    # the report, by rank 0 alone
    assert again_log.count("wrote ") == 1 and (tmp_path / "ranks" / "results.md").is_file()
    alone("alone", *study)
    results = [Path(r["out_dir"]).name for r in json.loads((tmp_path / "ranks" / "results.json").read_text())]
    assert len(set(results)) == len(results) == 4
    assert summaries(tmp_path / "ranks") == summaries(tmp_path / "alone")


@pytest.mark.slow  # torchrun twice, and the same study in this process
def test_a_tuned_study_under_torchrun_makes_the_same_choices_and_a_rerun_trains_nothing(runner, tmp_path,
                                                                                         monkeypatch):
    flags, env, alone = runner
    study = ("--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1", "--tune_lr", "3e-3", "3e-2",
             "--max_steps", "12", "--eval_interval", "6", "--warmup_steps", "0")
    ranks = torchrun(flags("ranks", *study), env, tmp_path / "ranks.log")
    log = finish(ranks, tmp_path / "ranks.log")
    assert ranks.returncode == 0, log[-3000:]
    assert whole_lines(log) and trained_once(tmp_path / "ranks")
    alone("alone", *study)
    assert json.loads((tmp_path / "ranks" / "tuning.json").read_text()) == json.loads(
        (tmp_path / "alone" / "tuning.json").read_text())
    assert summaries(tmp_path / "ranks") == summaries(tmp_path / "alone")
    before = records(tmp_path / "ranks")
    again = torchrun(flags("ranks", *study), env, tmp_path / "again.log")  # the same command: no training
    again_log = finish(again, tmp_path / "again.log")
    assert again.returncode == 0 and records(tmp_path / "ranks") == before, again_log[-3000:]

    def no_training(args, **_):
        raise AssertionError(f"trained {args.out_dir} again")
    monkeypatch.setattr("study.runner.train", no_training)
    alone("ranks", *study)  # the same study folder, continued (here without torchrun): nothing left to train
