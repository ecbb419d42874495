"""Latency and fault injection around any ``Env``, for experiments on env-level asynchrony and redundancy.

Each ``reset``/``step`` first draws its fate from the instance's own seeded stream: fail-stop (raise
``EnvError``) with ``fail_stop_prob``, fail-slow (hang ``hang_s``) with ``fail_slow_prob``, otherwise a delay
from the configured distribution; then the wrapped call runs. The stream is ``(faults.seed, instance)``, so a
run with the same seed and the same sequence of calls per instance sees the same delays and faults.

Key decision: the lognormal is parametrised by its *mean* and log-space sigma (mu = ln(mean) - sigma²/2), so a
σ sweep changes only the spread, never the mean cost, and speedups across σ are comparable.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.env_kinds import EnvFaultConfig
from asyncrl.envs.base import Env, EnvError, StepResult


def draw_delay(config: EnvFaultConfig, rng: random.Random) -> float:
    """One call's added delay in seconds (module docstring for the parametrisation)."""
    if config.delay == "none":
        return 0.0
    if config.delay == "constant":
        return config.mean_s
    if config.delay == "gaussian":
        return max(0.0, rng.gauss(config.mean_s, config.sigma_s))
    if config.mean_s == 0:
        return 0.0
    mu = math.log(config.mean_s) - config.sigma**2 / 2
    return rng.lognormvariate(mu, config.sigma)


@dataclass
class FaultStats:
    """What one wrapper instance injected, for experiment reports and tests."""

    num_calls: int = 0
    num_fail_stop: int = 0
    num_fail_slow: int = 0
    delays_s: list[float] = field(default_factory=list)


class FaultyEnv:
    """``Env`` that adds delays and faults (module docstring) before delegating to ``env``."""

    def __init__(self, env: Env, config: EnvFaultConfig, instance: int = 0) -> None:
        self.env = env
        self.config = config
        self.rng = random.Random(f"{config.seed}/{instance}")
        self.stats = FaultStats()

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        await self._inject("reset", delay=self.config.delay_reset)
        return await self.env.reset(seed)

    async def step(self, action: str) -> StepResult:
        await self._inject("step", delay=True)
        return await self.env.step(action)

    async def _inject(self, call: str, *, delay: bool) -> None:
        self.stats.num_calls += 1
        fate = self.rng.random()
        seconds = draw_delay(self.config, self.rng) if delay else 0.0
        if fate < self.config.fail_stop_prob:
            self.stats.num_fail_stop += 1
            raise EnvError(
                f"injected fail-stop in {call} (env.faults.fail_stop_prob={self.config.fail_stop_prob})"
            )
        if fate < self.config.fail_stop_prob + self.config.fail_slow_prob:
            self.stats.num_fail_slow += 1
            seconds = self.config.hang_s
        else:
            self.stats.delays_s.append(seconds)
        if seconds > 0:
            await asyncio.sleep(seconds)
