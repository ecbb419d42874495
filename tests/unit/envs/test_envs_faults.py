"""The latency/fault wrapper: seeded reproducibility, delay statistics, fail-stop and fail-slow."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import statistics

import pytest

from asyncrl.config.env import EnvConfig
from asyncrl.config.env_kinds import EnvFaultConfig
from asyncrl.envs import EnvError, env_factory, make_env
from asyncrl.envs.faults import FaultyEnv, draw_delay


def draws(config: EnvFaultConfig, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [draw_delay(config, rng) for _ in range(n)]


def test_constant_and_none() -> None:
    assert draws(EnvFaultConfig(delay="constant", mean_s=0.3), 3) == [0.3, 0.3, 0.3]
    assert draws(EnvFaultConfig(delay="none", mean_s=0.3), 2) == [0.0, 0.0]


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.5])
def test_lognormal_keeps_its_mean_as_sigma_grows(sigma: float) -> None:
    samples = draws(EnvFaultConfig(delay="lognormal", mean_s=2.0, sigma=sigma), 200_000)
    assert statistics.fmean(samples) == pytest.approx(2.0, rel=0.03 * math.exp(sigma**2 / 2))
    logs = [math.log(x) for x in samples]
    assert statistics.pstdev(logs) == pytest.approx(sigma, rel=0.01)


def test_gaussian_statistics_and_clipping() -> None:
    samples = draws(EnvFaultConfig(delay="gaussian", mean_s=1.0, sigma_s=0.2), 50_000)
    assert statistics.fmean(samples) == pytest.approx(1.0, abs=0.005)
    assert statistics.pstdev(samples) == pytest.approx(0.2, rel=0.02)
    assert min(draws(EnvFaultConfig(delay="gaussian", mean_s=0.1, sigma_s=1.0), 1000)) == 0.0


class Instant:
    async def reset(self, seed: int):
        return "o", {}

    async def step(self, action: str):
        from asyncrl.envs import StepResult

        return StepResult("o", 0.0, False, False, {})


def fates(config: EnvFaultConfig, instance: int, n: int) -> list[str]:
    """Call ``step`` n times (``hang_s`` 0, so a fail-slow call is counted, not waited); each call's fate."""
    env = FaultyEnv(Instant(), config, instance)

    async def main() -> list[str]:
        out = []
        for _ in range(n):
            slow_before = env.stats.num_fail_slow
            try:
                await env.step("a")
                out.append("slow" if env.stats.num_fail_slow > slow_before else "ok")
            except EnvError:
                out.append("stop")
        return out

    return asyncio.run(main())


def test_fail_slow_hangs_for_hang_s() -> None:
    env = FaultyEnv(Instant(), EnvFaultConfig(fail_slow_prob=1.0, hang_s=60.0))
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(env.step("a"), 0.05))
    assert env.stats.num_fail_slow == 1


def test_fault_rates_and_reproducibility() -> None:
    config = EnvFaultConfig(fail_stop_prob=0.2, fail_slow_prob=0.1, hang_s=0.0, seed=4)
    first = fates(config, instance=1, n=400)
    assert first == fates(config, instance=1, n=400)  # same seed and instance: same fates
    assert first != fates(config, instance=2, n=400)  # instances do not fail in unison
    assert first.count("stop") / 400 == pytest.approx(0.2, abs=0.05)
    assert first.count("slow") / 400 == pytest.approx(0.1, abs=0.04)


def test_stats_count_what_was_injected() -> None:
    env = FaultyEnv(Instant(), EnvFaultConfig(delay="constant", mean_s=0.001, fail_stop_prob=0.5, seed=1))

    async def main() -> None:
        for _ in range(40):
            with contextlib.suppress(EnvError):
                await env.step("a")

    asyncio.run(main())
    assert env.stats.num_calls == 40 and env.stats.num_fail_slow == 0
    assert env.stats.num_fail_stop + len(env.stats.delays_s) == 40 and 10 < env.stats.num_fail_stop < 30
    assert set(env.stats.delays_s) == {0.001}


def test_make_env_wraps_only_when_asked() -> None:
    assert not isinstance(make_env(EnvConfig(type="sokoban")), FaultyEnv)
    faults = EnvFaultConfig(delay="lognormal", mean_s=0.01, sigma=1.0)
    assert isinstance(make_env(EnvConfig(type="sokoban", faults=faults)), FaultyEnv)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"delay": "pareto"}, "env.faults.delay"),
        ({"fail_stop_prob": 1.5}, "env.faults.fail_stop_prob"),
        ({"fail_stop_prob": 0.6, "fail_slow_prob": 0.6}, "fail_slow_prob"),
        ({"mean_s": -1.0}, "env.faults.mean_s"),
    ],
)
def test_bad_fault_config_names_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EnvFaultConfig(**overrides)


def test_env_factory_numbers_instances_so_streams_differ() -> None:
    config = EnvConfig(
        type="sokoban", faults=EnvFaultConfig(delay="lognormal", mean_s=1.0, sigma=1.0, seed=3)
    )
    make = env_factory(config)
    first, second = make(), make()
    again = env_factory(config)()
    assert [first.rng.random() for _ in range(3)] == [again.rng.random() for _ in range(3)]
    assert first.rng.random() != second.rng.random()
