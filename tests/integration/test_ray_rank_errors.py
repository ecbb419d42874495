"""One trainer rank's error mid-step fails the group's call at once, by name, on real Ray actors in a real gloo
group: rank 1 raises a CUDA out-of-memory error while rank 0 waits for it in an all-reduce.

Before, the driver's ``ray.get`` over both ranks raised rank 1's error as soon as it landed (Ray 2.60 does not
wait for the other refs once one holds an error) but as the rank's own ``OutOfMemoryError``: not ``TrainerDied``,
so the run ended instead of restarting from its checkpoint, and rank 0 was left in the all-reduce until the
group's timeout (``trainer_group.collective_timeout_s``; 693 s for the 8B recipe) or the run's teardown. That
code fails this test's first assertion. ``GROUP_TIMEOUT_S`` bounds the test should the client wait for rank 0."""

from __future__ import annotations

import pytest
import ray
import torch
import torch.distributed as dist
from ray.exceptions import RayActorError
from ray_actors import until_dead

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.runtime.errors import TrainerDied
from asyncrl.runtime.ray_runtime import ray_session
from asyncrl.runtime.trainer_group import TrainerGroupClient
from asyncrl.trainer.distributed.process_group import free_port, join_process_group

pytestmark = pytest.mark.ray

GROUP_TIMEOUT_S = 60.0
"""The ranks' gloo timeout: how long rank 0 would wait in the all-reduce for rank 1."""
STEP_TIMEOUT_S = 300.0
"""The driver's deadline for the step, longer than the group's."""
ANSWER_S = 60.0
"""Bound on the checks' own calls to the ranks."""


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class StepRank:
    """A trainer rank reduced to its step's collective: rank 1 runs out of device memory before it gets there."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def rendezvous(self) -> tuple[str, int]:
        return "127.0.0.1", free_port("127.0.0.1")

    def start(self, host: str, port: int) -> dict:
        join_process_group(
            device="cpu", host=host, port=port, rank=self.rank, world_size=2, timeout_s=GROUP_TIMEOUT_S
        )
        return self.progress()

    def progress(self) -> dict:
        return {"step": 0, "version": 0, "checkpoint_bytes": 0}

    def train_step(self, groups: list, policy_version: int) -> dict:
        if self.rank == 1:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (9216-token micro-batch)"
            )
        loss = torch.ones(1)
        dist.all_reduce(loss)  # waits for rank 1, which never comes
        return {"loss": float(loss)}


@pytest.fixture(scope="module")
def ray_local():
    """A Ray of this test's own (``address="local"``: never another process's cluster on this machine)."""
    with ray_session(RuntimeConfig(type="local")) as session:
        yield session


def test_a_rank_raising_mid_step_fails_the_step_by_name_and_stops_the_rank_in_the_collective(
    ray_local,
) -> None:
    handles = [StepRank.remote(rank) for rank in range(2)]
    host, port = ray.get(handles[0].rendezvous.remote(), timeout=ANSWER_S)
    progress = ray.get([handle.start.remote(host, port) for handle in handles], timeout=ANSWER_S)
    runtime = RuntimeConfig(type="local", train_step_timeout_s=STEP_TIMEOUT_S)
    group = TrainerGroupClient(handles, runtime, progress, WeightSyncConfig())
    try:
        with pytest.raises(TrainerDied) as raised:
            group.train_step([], policy_version=3)
        message = str(raised.value)
        assert message.startswith("trainer: train_step(v3): the trainer is lost (rank 1: ")
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in message
        with pytest.raises(RayActorError):  # rank 0 was killed in its all-reduce, not left to time out
            ray.get(handles[0].progress.remote(), timeout=ANSWER_S)
        assert ray.get(handles[1].progress.remote(), timeout=ANSWER_S)["step"] == 0  # idle: shutdown ends it
    finally:
        group.shutdown()
    assert isinstance(until_dead(handles[1].progress.remote, ANSWER_S), RayActorError)
