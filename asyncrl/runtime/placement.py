"""Placement arithmetic: how many Ray CPUs and torch threads each role gets (pure; no Ray, no torch). The Ray
runtimes reserve and thread their actors by it, the inline runtime threads its engine and trainer threads by it.

The shares are ``RuntimeConfig.cpu_shares``: set ones as given, null ones splitting the usable cores (half
each on this machine's 2 cores: 1 + 1). Disjoint (async modes): each of the ``n`` engines reserves ``rollout_num_cpus / n`` CPUs and each of the
trainer's ``w`` ranks ``train_num_cpus / w``; threads are those shares rounded down (at least 1). Colocated (``sync``): no actor
reserves CPUs, the trainer gets threads for every core and the engines share every core but the driver's
(``(total - driver_cpus) / n`` threads each, at least 1); the mode's barrier keeps rollout and training from computing at the same
time (see asyncrl/config/runtime.py). The core left over is the driver's (``runtime.driver_cpus``, 1 by
default). While the engines generate, the driver is busy too (scoring rewards, detokenizing, scheduling the
next requests), and an engine whose torch threads claim every core then waits at each op's thread barrier
whenever the driver takes one of its cores. Measured on 2 cores when the default was chosen (the default
example in sync, 40 steps, 3 runs each; not a result file): the engine generated in 5.5–6.7 s with one thread
against 8.1–8.4 s with two. The trainer keeps every core: while it trains, sync's driver waits.

With ``runtime.pin_cores`` a disjoint placement also pins each actor to its own cores (``os.sched_setaffinity``):
the trainer takes the first ``ceil(train_num_cpus)`` usable cores and the engines split the next
``ceil(rollout_num_cpus)``, the way the seeds give rollout and training separate devices. Without pinning the
OS may still run both roles on one core at times; with it, a loaded machine cannot make them share.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.modes import mode_spec


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Resources of each actor of one run."""

    colocated: bool
    engine_num_cpus: float
    """Ray CPU resource each engine actor reserves."""
    engine_threads: int
    """torch threads inside each engine actor."""
    trainer_num_cpus: float
    """Ray CPU resource each trainer rank reserves."""
    trainer_threads: int
    """torch threads inside each trainer rank."""
    trainer_cores: tuple[int, ...] = ()
    """Cores the trainer's ranks are pinned to, split evenly between them (``rank_cores``); empty: not pinned."""
    engine_cores: tuple[tuple[int, ...], ...] = ()
    """Cores each engine actor is pinned to (one tuple per engine); empty: not pinned."""

    def rank_cores(self, rank: int, world_size: int) -> tuple[int, ...]:
        """The cores trainer rank ``rank`` of ``world_size`` is pinned to (empty: not pinned)."""
        if not self.trainer_cores:
            return ()
        return tuple(_even_parts(self.trainer_cores, world_size)[rank])

    def describe(self) -> dict[str, object]:
        """The split as plain data, for a run's or a benchmark's record."""
        return {
            "colocated": self.colocated,
            "trainer": {
                "num_cpus": self.trainer_num_cpus,
                "threads": self.trainer_threads,
                "cores": self.trainer_cores,
            },
            "engine": {
                "num_cpus": self.engine_num_cpus,
                "threads": self.engine_threads,
                "cores": self.engine_cores,
            },
        }


def is_colocated(config: RuntimeConfig, mode: str, async_ratio: float | None = None) -> bool:
    """Whether rollout and training share every core: ``colocate: auto`` does so when rollout never overlaps
    training: the mode never lets it (``sync``), or the run's α is 0 (an ``async`` run at α = 0 waits exactly
    as sync does, and trains exactly what sync trains only if it computes with the same threads)."""
    if config.colocate != "auto":
        return config.colocate == "always"
    return not mode_spec(mode).rollout_overlaps_training or async_ratio == 0


def plan_placement(
    config: RuntimeConfig,
    *,
    num_engines: int,
    mode: str,
    usable_cores: Sequence[int] | None = None,
    num_trainer_workers: int = 1,
    async_ratio: float | None = None,
) -> Placement:
    """The CPU reservation and thread count of each trainer rank (``train_num_cpus`` split over
    ``num_trainer_workers``) and of each of ``num_engines`` engines (and their cores, with ``pin_cores``, out of
    ``usable_cores``: by default this process's affinity), for a run of ``mode`` at ``async_ratio`` (None: the
    mode's own, see ``is_colocated``)."""
    if num_engines < 1:
        raise ValueError(f"rollout.num_engines must be >= 1, got {num_engines}")
    if num_trainer_workers < 1:
        raise ValueError(f"trainer.num_workers must be >= 1, got {num_trainer_workers}")
    rollout_cpus, train_cpus = config.cpu_shares(None if usable_cores is None else len(usable_cores))
    total = rollout_cpus + train_cpus
    if is_colocated(config, mode, async_ratio):
        return Placement(
            colocated=True,
            engine_num_cpus=0.0,
            engine_threads=num_threads(max(total - config.driver_cpus, 1.0) / num_engines),
            trainer_num_cpus=0.0,
            trainer_threads=num_threads(total / num_trainer_workers),
        )
    engine_share = rollout_cpus / num_engines
    trainer_cores, engine_cores = (), ()
    if config.pin_cores:
        cores = sorted(os.sched_getaffinity(0)) if usable_cores is None else list(usable_cores)
        trainer_cores, engine_cores = split_cores(cores, rollout_cpus, train_cpus, num_engines)
    return Placement(
        colocated=False,
        engine_num_cpus=engine_share,
        engine_threads=num_threads(engine_share),
        trainer_num_cpus=train_cpus / num_trainer_workers,
        trainer_threads=num_threads(train_cpus / num_trainer_workers),
        trainer_cores=trainer_cores,
        engine_cores=engine_cores,
    )


def split_cores(
    cores: Sequence[int], rollout_cpus: float, train_cpus: float, num_engines: int
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Disjoint core sets: the trainer's, then each engine's (engines with a fractional share share cores)."""
    train, rollout = math.ceil(train_cpus - 1e-9), math.ceil(rollout_cpus - 1e-9)
    if train + rollout > len(cores):
        raise ValueError(
            f"runtime.pin_cores needs runtime.train_num_cpus + runtime.rollout_num_cpus (rounded up: {train} + "
            f"{rollout}) <= usable cores ({len(cores)})"
        )
    trainer, rollout_cores = tuple(cores[:train]), cores[train : train + rollout]
    per_engine = [tuple(part) for part in _even_parts(rollout_cores, num_engines)]
    return trainer, tuple(per_engine)


def _even_parts(cores: Sequence[int], parts: int) -> list[list[int]]:
    """``parts`` near-equal slices of ``cores``; with fewer cores than parts, parts reuse cores round-robin."""
    if len(cores) >= parts:
        size, extra = divmod(len(cores), parts)
        out, start = [], 0
        for index in range(parts):
            end = start + size + (index < extra)
            out.append(list(cores[start:end]))
            start = end
        return out
    return [[cores[index % len(cores)]] for index in range(parts)]


def pin(cores: Sequence[int]) -> None:
    """Pin this process to ``cores`` (no-op when empty, or where the OS has no affinity call)."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))


def num_threads(num_cpus: float) -> int:
    """Whole threads for a CPU share: rounded down (with float slack, so 3 × (1/3) CPU is 1), at least 1."""
    return max(1, math.floor(num_cpus + 1e-9))
