"""study/parallel.py and the ablation runner under torchrun: ranks train whole runs side by side, each run exactly
as the study without torchrun trains it, none twice, none lost when a rank is killed."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from common.cli import UserError
from common.environment import usable_cores
from scripts import run_ablation
from study import lr_tuning, parallel
from study.parallel import Worker, train_in_parallel, try_claim
from study.runner import tune_plan

REPO = Path(__file__).resolve().parents[1]
COMPARED = ("step", "diverged", "train_loss", "val_loss", "val_bpb", "num_params", "seed", "variant")


def test_two_ranks_share_the_runs_and_train_each_once(tmp_path, monkeypatch):
    """Two workers (threads here, processes under torchrun) over one folder of claims: every run trains once, both
    work, and a run another worker finished drops out of what is pending."""
    monkeypatch.setattr(parallel, "POLL_S", 0.01)
    runs = [f"run{i}" for i in range(8)]
    done, trained = tmp_path / "done", []
    done.mkdir()

    def pending():
        return [run for run in runs if not (done / run).exists()]

    def worker(name):
        def train(run):
            if not (done / run).exists():  # as the runner does, decided under the claim
                trained.append((name, run))
                time.sleep(0.02)
                (done / run).write_text(name)
        train_in_parallel(pending, lambda run: tmp_path / f"{run}.lock", lambda run: done, train, timeout_min=1)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(worker, ("a", "b")))  # (list: a worker's exception fails the test)
    assert sorted(run for _, run in trained) == runs  # each once
    assert {name for name, _ in trained} == {"a", "b"}


def test_a_claim_is_refused_while_held_and_a_folder_without_file_locks_is_refused(tmp_path, monkeypatch):
    parallel.require_locks(tmp_path / "claims")  # a local filesystem has them; the probe's claim is released
    with try_claim(tmp_path / "claims" / "probe.lock"):
        assert try_claim(tmp_path / "claims" / "probe.lock") is None
        parallel.require_locks(tmp_path / "claims")  # another rank probing at the same moment
    monkeypatch.setattr(parallel, "exclusive_lock", lambda path: contextlib.nullcontext(False))
    with pytest.raises(UserError, match="without file locks, so the ranks cannot share out the runs"):
        parallel.require_locks(tmp_path / "claims")


def test_an_idle_rank_gives_up_when_the_runs_it_waits_for_stop_changing(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "POLL_S", 0.01)
    lock = tmp_path / "run.lock"
    with try_claim(lock), pytest.raises(UserError, match=r"have not changed for 0.001 minutes \(--dist_timeout\)"):
        train_in_parallel(lambda: ["run"], lambda run: lock, lambda run: tmp_path, lambda run: None,
                          timeout_min=0.001)


def test_a_worker_takes_its_own_share_and_hides_torchrun_from_the_trainer(monkeypatch):
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(name, value)  # (and restored after the test, whatever own_share sets)
    worker = Worker.from_environment()
    assert worker == Worker(rank=3, world_size=4, local_rank=1, local_world_size=2)
    threads = []
    monkeypatch.setattr(parallel, "usable_cores", lambda: 6)
    monkeypatch.setattr(parallel.torch, "set_num_threads", threads.append)  # this process's own threads stay
    worker.own_share(run_ablation.parse_args(["--device", "cpu"])[1])
    assert threads == [3]  # six cores, two ranks on this machine
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("1", "0", "0")


def test_tuning_sends_every_grid_run_out_before_any_other_seed(monkeypatch):
    study, _ = run_ablation.parse_args(["--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1", "2",
                                        "--tune_lr", "1e-3", "2e-3", "4e-3"])
    point = lambda run: lr_tuning.Point(run[2], abs(run[2] - 2e-3), True)  # noqa: E731
    grid = {("pre-rmsnorm", 8, lr, study.warmup_steps[0], seed): {} for lr in (1e-3, 2e-3, 4e-3) for seed in (0, 1)}
    plan = tune_plan(study, grid, point, print)  # pre's grid is done, post's not started
    assert list(plan.pending.values()) == ["grid"] * 6 + ["seed"]
    assert list(plan.pending)[-1] == ("pre-rmsnorm", 8, 2e-3, study.warmup_steps[0], 2)
    assert [t["variant"] for t in plan.tuning] == ["pre-rmsnorm"] and plan.groups == {}


# ---------------------------------------------------------------------------------------------------------
# Under torchrun, in fresh processes, against the same study trained in this process without it


def torchrun(flags: list[str], env: dict, log: Path) -> subprocess.Popen:
    """The runner under torchrun on 2 ranks, its output into log (a pipe nobody reads while the test polls would fill
    up and stop the ranks)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(REPO / "scripts" / "run_ablation.py"), *flags]
    with open(log, "w") as out:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path) -> str:
    process.wait(timeout=600)
    return log.read_text()


def trained(log: str) -> list[str]:
    """The runs a runner's output says it trained (a resumed run counts again)."""
    return [line[4:] for line in log.splitlines() if line.startswith("=== ")]


@pytest.fixture
def runner(tmp_path, tiny_flags, monkeypatch):
    """(flags of a tiny study in folder `name`, torchrun's environment, the study trained in this process): one
    token cache for all, and the threads a rank gets for every run (a run's float arithmetic depends on them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(MINIMIND_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", HOME=str(tmp_path))
    monkeypatch.setenv("MINIMIND_CACHE", env["MINIMIND_CACHE"])

    def flags(name: str, *more: str) -> list[str]:
        return ["--out_dir", str(tmp_path / name), *tiny_flags, "--log_interval", "5", "--dist_timeout", "2", *more]

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
    """2 variants x 2 seeds on 2 ranks. A rank is killed once a run is finished and another has a checkpoint; the
    same command then finishes the study: the finished run is not trained again, the others resume, and every
    summary equals that of the study without torchrun, bit for bit (exact resume included)."""
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
    before = {name: (folder / name / "summary.json").read_text() for name in finished}
    rank = max(children(first.pid))
    # the run the rank holds: each claim file carries its holder's pid
    held = {p.stem for p in (tmp_path / "ranks" / ".claims").glob("*.lock") if p.read_text().strip() == str(rank)}
    os.kill(rank, signal.SIGKILL)
    first_log = finish(first, tmp_path / "first.log")
    assert first.returncode != 0
    again = torchrun(flags("ranks", *study), env, tmp_path / "again.log")
    again_log = finish(again, tmp_path / "again.log")
    assert again.returncode == 0, again_log[-3000:]
    assert {name: (folder / name / "summary.json").read_text() for name in finished} == before  # not trained again
    assert not set(trained(again_log)) & finished
    assert set(trained(first_log)) | set(trained(again_log)) == {p.name for p in folder.iterdir()}
    # No two ranks took the same run, except that the killed rank's run, freed with its claim, may be taken over by
    # the other rank before torchrun stops it too.
    taken = trained(first_log)
    assert {run for run in taken if taken.count(run) > 1} <= held and all(taken.count(run) <= 2 for run in held)
    assert again_log.count("wrote ") == 1 and (tmp_path / "ranks" / "results.md").is_file()  # the report, by rank 0
    alone("alone", *study)
    assert summaries(tmp_path / "ranks") == summaries(tmp_path / "alone")


@pytest.mark.slow  # torchrun, and the same study in this process
def test_a_tuned_study_under_torchrun_makes_the_same_choices_and_a_rerun_trains_nothing(runner, tmp_path,
                                                                                         monkeypatch):
    flags, env, alone = runner
    study = ("--variants", "pre-rmsnorm", "post-rmsnorm", "--seeds", "0", "1", "--tune_lr", "3e-3", "3e-2",
             "--max_steps", "12", "--eval_interval", "6", "--warmup_steps", "0")
    ranks = torchrun(flags("ranks", *study), env, tmp_path / "ranks.log")
    log = finish(ranks, tmp_path / "ranks.log")
    assert ranks.returncode == 0, log[-3000:]
    assert sorted(trained(log)) == sorted(p.name for p in (tmp_path / "ranks" / "runs").iterdir())  # once each
    alone("alone", *study)
    assert json.loads((tmp_path / "ranks" / "tuning.json").read_text()) == json.loads(
        (tmp_path / "alone" / "tuning.json").read_text())
    assert summaries(tmp_path / "ranks") == summaries(tmp_path / "alone")

    def no_training(args):
        raise AssertionError(f"trained {args.out_dir} again")
    monkeypatch.setattr("study.runner.train", no_training)
    alone("ranks", *study)  # the same study folder, continued (here without torchrun): nothing left to train
