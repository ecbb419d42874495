"""The inline runtime threads its roles by the same placement plan as the Ray runtimes: disjoint shares while
rollout overlaps training, every core for each role behind sync's barrier (all but the driver's for the
engine), whatever the calling thread's torch thread count happens to be (a benchmark running several runs in
one process must get the same split every time)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config.run import load_run_config
from asyncrl.runtime.inline import build_parts

SHARES = (
    "runtime.rollout_num_cpus=1",
    "runtime.train_num_cpus=3",
    "model.path=tiny-copy",
    "model.device=cpu",
)


def threads_used(mode: str) -> tuple[int, int, dict]:
    """(engine threads, trainer threads, placement record) of an inline run in ``mode``."""
    overlap = [] if mode == "sync" else ["buffer.async_ratio=1"]  # at α = 0 an async mode is placed as sync
    config = load_run_config(None, [*SHARES, f"controller.mode={mode}", *overlap])
    parts = build_parts(config)
    try:
        trainer_threads = parts.trainer.on_training_thread(torch.get_num_threads)
        return parts.engines[0]._num_threads, trainer_threads, parts.locations()
    finally:
        parts.close()


@pytest.mark.parametrize(("mode", "engine", "trainer"), [("async", 1, 3), ("sync", 3, 4), ("async", 1, 3)])
def test_roles_compute_with_their_planned_threads(mode: str, engine: int, trainer: int) -> None:
    torch.set_num_threads(2)  # the caller's count must not leak into the roles
    engine_threads, trainer_threads, where = threads_used(mode)
    assert (engine_threads, trainer_threads) == (engine, trainer)
    assert where["engine"]["threads"] == engine and where["trainer"]["threads"] == trainer
    assert where["colocated"] is (mode == "sync")
