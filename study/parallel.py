"""A study's runs side by side under torchrun (--parallel runs): every rank makes the same plan from the
finished runs' summaries and trains run i of it when i % world_size is its rank; then all meet, and replan."""

import functools
import os
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from common.cli import UserError
from common.environment import usable_cores
from trainer.runtime import pick_device


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

    def own_share(self, base) -> None:
        """Make each run this process trains a single-process run on its own GPU or its share of the cores."""
        if pick_device(base.device).type == "cuda":
            if self.local_world_size > torch.cuda.device_count():
                raise UserError(f"{self.local_world_size} ranks on this node but {torch.cuda.device_count()} "
                                "GPUs: start torchrun with --nproc_per_node at most the number of GPUs")
            torch.cuda.set_device(self.local_rank)  # what --device cuda means; runs record the flag as given
        else:
            torch.set_num_threads(max(1, usable_cores() // self.local_world_size))
        # torchrun's variables hidden: else the trainer would join the ranks' runs into one DDP job
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")


@functools.cache
def study_store(worker: Worker) -> dist.Store:
    """torchrun's key-value store (its agent's, or one rank 0 holds). The ranks meet through it and join no
    process group: within one, transformers' save_pretrained writes weights on rank 0 only, and each rank's
    runs are single-process runs that must save their own."""
    on_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), worker.world_size,
                         is_master=worker.rank == 0 and not on_agent)


MEETINGS = Counter()  # per rank: how many times it has met the others


def meet(worker: Worker, minutes: float) -> None:
    """Wait for every rank, at most `minutes`; a late rank is one line (torchrun ends all on a dead one)."""
    MEETINGS[worker.rank] += 1
    store, everyone = study_store(worker), f"minimind-study/meeting-{MEETINGS[worker.rank]}"
    if store.add(everyone, 1) == worker.world_size:
        store.set(f"{everyone}/all", "")
    try:
        store.wait([f"{everyone}/all"], timedelta(minutes=minutes))
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
