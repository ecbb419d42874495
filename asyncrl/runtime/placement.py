"""Placement arithmetic: how many Ray CPUs and torch threads each actor gets (pure; no Ray, no torch).

Disjoint (async modes): each of the ``n`` engines reserves ``rollout_num_cpus / n`` CPUs and the trainer
``train_num_cpus``; threads are those shares rounded down (at least 1). Colocated (``sync``): no actor
reserves CPUs, the trainer gets threads for every core and each engine ``total / n`` of them; the mode's
barrier keeps rollout and training from computing at the same time (see asyncrl/config/runtime.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from asyncrl.config.runtime import RuntimeConfig


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Resources of each actor of one run."""

    colocated: bool
    engine_num_cpus: float
    """Ray CPU resource each engine actor reserves."""
    engine_threads: int
    """torch threads inside each engine actor."""
    trainer_num_cpus: float
    trainer_threads: int


def is_colocated(config: RuntimeConfig, mode: str) -> bool:
    """Whether rollout and training share every core: ``colocate: auto`` does so in ``sync`` mode only."""
    return config.colocate == "always" or (config.colocate == "auto" and mode == "sync")


def plan_placement(config: RuntimeConfig, *, num_engines: int, mode: str) -> Placement:
    """The CPU reservation and thread count of the trainer and of each of ``num_engines`` engines."""
    if num_engines < 1:
        raise ValueError(f"rollout.num_engines must be >= 1, got {num_engines}")
    total = config.num_cpus
    if is_colocated(config, mode):
        return Placement(
            colocated=True,
            engine_num_cpus=0.0,
            engine_threads=num_threads(total / num_engines),
            trainer_num_cpus=0.0,
            trainer_threads=num_threads(total),
        )
    engine_share = config.rollout_num_cpus / num_engines
    return Placement(
        colocated=False,
        engine_num_cpus=engine_share,
        engine_threads=num_threads(engine_share),
        trainer_num_cpus=config.train_num_cpus,
        trainer_threads=num_threads(config.train_num_cpus),
    )


def num_threads(num_cpus: float) -> int:
    """Whole threads for a CPU share: rounded down (with float slack, so 3 × (1/3) CPU is 1), at least 1."""
    return max(1, math.floor(num_cpus + 1e-9))
