"""A study's runs side by side under torchrun (--parallel runs): every rank makes the same plan from the
finished runs' summaries and trains run i of it when i % world_size is its rank; then all meet, and replan."""

import functools
import os
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from common.cli import UserError


@dataclass(frozen=True)
class Worker:
    """This process's place in the study: a torchrun rank, or the one process of a plain run."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @classmethod
    def from_environment(cls) -> "Worker":
        env, world_size = os.environ, int(os.environ.get("WORLD_SIZE", "1"))
        return cls(int(env.get("RANK", "0")), world_size, int(env.get("LOCAL_RANK", "0")),
                   int(env.get("LOCAL_WORLD_SIZE", str(world_size))))


@functools.cache
def study_store(worker: Worker) -> dist.Store:  # torchrun's: its agent's, or rank 0's where it keeps none
    on_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), worker.world_size,
                         is_master=worker.rank == 0 and not on_agent)


MEETINGS = Counter()  # per rank: the meetings it has been to


def meet(worker: Worker, minutes: float) -> None:
    """Wait for every rank, at most `minutes`, through torchrun's store, not a process group: in one,
    transformers' save_pretrained writes weights on rank 0 only, and each rank's runs save their own. A dead
    rank ends them all (torchrun); a late one is one line."""
    MEETINGS[worker.rank] += 1
    keys = [f"minimind-study/meeting-{MEETINGS[worker.rank]}/{rank}" for rank in range(worker.world_size)]
    study_store(worker).set(keys[worker.rank], "")
    try:
        study_store(worker).wait(keys, timedelta(minutes=minutes))
    except RuntimeError as err:
        raise UserError(f"rank {worker.rank} waited past --dist_timeout for the others: {err}") from None


def train_in_parallel(pending, train, worker: Worker, timeout_min: float) -> None:
    """Train this rank's share of the runs pending() lists, round after round, until none is left; every run
    of a round is finished before any rank plans the next."""
    while runs := pending():
        meet(worker, timeout_min)  # all have planned before any trains: a finished run changes a later plan
        for run in runs[worker.rank::worker.world_size]:
            train(run)
        meet(worker, 365 * 24 * 60)  # others' runs take hours on a GPU: no limit
