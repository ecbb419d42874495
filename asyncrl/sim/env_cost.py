"""Simulated environments: step latency distributions, fail-slow and fail-stop steps, reward latency.

Key decision: a simulated env is a real ``Env`` whose calls sleep on the loop's (virtual) clock, so the real
``AgenticProducer`` and its EnvManagers run unchanged against it. Observations are strings of ``x``s that
``SimEnvTokenizer`` counts one token per character, so the context grows by exactly
``observation_tokens`` per turn. Each env instance draws from its own seeded stream and records its busy
spans (``ENV_KINDS``) on the run's ``Timeline`` as worker ``env<n>``, ``n`` counting instances in creation order.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.config.sim import SimEnvConfig
from asyncrl.envs.base import EnvError, StepResult
from asyncrl.metrics.timeline import Timeline, env_worker_name
from asyncrl.sim.workload import PassRates, unit_hash

ENV_KINDS = ("env_reset", "env_step", "reward", "env_fail")
"""Span kinds of a simulated env: a reset, a step's latency, the reward latency the last step pays, and the
whole of a step that fails (fail-stop)."""


def base_latency_s(config: SimEnvConfig, rng: random.Random) -> float:
    """One draw of the step latency: constant μ, Normal(μ, σ) truncated at 0, or lognormal with mean μ, sd σ."""
    mu, sigma = config.mean_s, config.sigma_s
    if config.latency == "constant" or sigma == 0:
        return mu
    if config.latency == "gaussian":
        return max(0.0, rng.gauss(mu, sigma))
    log_var = math.log1p((sigma / mu) ** 2)
    return math.exp(rng.gauss(math.log(mu) - log_var / 2, math.sqrt(log_var)))


def step_latency_s(config: SimEnvConfig, rng: random.Random, slow_seed: bool = False) -> tuple[float, bool]:
    """(latency, fails): a base draw, stretched by ``fail_slow_factor`` with probability ``fail_slow_p`` or
    always on a slow seed; ``fails`` with probability ``fail_stop_p``."""
    latency = base_latency_s(config, rng)
    if rng.random() < config.fail_slow_p or slow_seed:
        latency *= config.fail_slow_factor
    return latency, rng.random() < config.fail_stop_p


def is_slow_seed(config: SimEnvConfig, seed: int) -> bool:
    """Whether every env reset with ``seed`` is slow: a pure function of the seed, shared by its group."""
    return unit_hash(0, f"slow seed {seed}") < config.slow_seed_p


def step_spans(latency_s: float, reward_s: float, fails: bool) -> list[tuple[float, str]]:
    """(duration, kind) of the parts of one step call, in order: its latency, then the reward latency (0
    except on the last step); a failing call is ``env_fail`` throughout, since all of it is lost."""
    if fails:
        return [(latency_s + reward_s, "env_fail")]
    return [(latency_s, "env_step"), (reward_s, "reward")]


class SimEnv:
    """An episode of ``num_turns`` steps with simulated latencies; the last step pays the reward latency and
    returns a Bernoulli reward at the pass rate of the episode's seed (shared by its group).

    Each call sleeps once (so recording spans cannot move the schedule) and, when it returns, fails or is
    cancelled, records the time it held the env on ``timeline`` under ``name``."""

    def __init__(
        self,
        config: SimEnvConfig,
        prompt_tokens: int,
        pass_rates: PassRates,
        rng: random.Random,
        *,
        name: str = env_worker_name(0),
        timeline: Timeline | None = None,
    ):
        self.config = config
        self.prompt_tokens = prompt_tokens
        self.pass_rates = pass_rates
        self.rng = rng
        self.name = name
        self.timeline = timeline or Timeline(enabled=False)
        self._seed = 0
        self._turn = 0
        self._slow = False

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if self.config.reset_s:
            await self._busy([(self.config.reset_s, "env_reset")])
        self._seed, self._turn = seed, 0
        self._slow = is_slow_seed(self.config, seed)
        return "x" * self.prompt_tokens, {}

    async def step(self, action: str) -> StepResult:
        latency, fails = step_latency_s(self.config, self.rng, self._slow)
        self._turn += 1
        done = self._turn >= self.config.num_turns
        await self._busy(step_spans(latency, self.config.reward_latency_s if done else 0.0, fails))
        if fails:
            raise EnvError(f"simulated fail-stop at turn {self._turn}")
        reward = float(self.rng.random() < self.pass_rates.rate(f"seed{self._seed}")) if done else 0.0
        return StepResult("x" * self.config.observation_tokens, reward, done, False, {})

    async def _busy(self, parts: list[tuple[float, str]]) -> None:
        """Sleep for the parts' total, then record each part as a span, clipped where a cancel cut it."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await asyncio.sleep(sum(duration for duration, _ in parts))
        finally:
            self._record(parts, start, loop.time())

    def _record(self, parts: list[tuple[float, str]], start: float, end: float) -> None:
        for duration, kind in parts:
            part_end = min(start + duration, end)
            self.timeline.add(self.name, start, part_end, kind)
            start = part_end


def make_sim_env_factory(
    config: SimEnvConfig,
    prompt_tokens: int,
    pass_rates: PassRates,
    seed: int,
    timeline: Timeline | None = None,
) -> Callable[[], SimEnv]:
    """Each call builds the next env instance, with its own random stream from (seed, instance number) and
    its own timeline worker ``env<instance number>`` (a replacement env is a new worker)."""
    counter = itertools.count()

    def make() -> SimEnv:
        index = next(counter)
        rng = random.Random(zlib.crc32(f"{seed}\0env\0{index}".encode()))
        return SimEnv(config, prompt_tokens, pass_rates, rng, name=env_worker_name(index), timeline=timeline)

    return make


class SimEnvTokenizer:
    """One token per character of an observation; responses decode to the engine's text (the request id)."""

    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [1] * len(text)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return ""
