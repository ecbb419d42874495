"""The Env protocol, the threaded adapter, the registry and the built-in count_chain game, exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asyncrl.config.env import EnvConfig, EnvManagerConfig, check_env_manager_fits
from asyncrl.envs import CountChainEnv, EnvError, StepResult, ThreadedEnv, make_env
from asyncrl.envs.count_chain import plan_turns


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_plan_is_a_pure_function_of_the_seed() -> None:
    assert plan_turns(EnvConfig(), 0) == [(25, 27), (28, 29), (30, 32)]
    assert plan_turns(EnvConfig(), 0) == plan_turns(EnvConfig(), 0)
    assert plan_turns(EnvConfig(num_turns=2, max_start=5, min_span=1, max_span=1), 7) == [(3, 3), (4, 4)]


async def _play(env: CountChainEnv, answers: list[str]) -> tuple[str, list[StepResult]]:
    first, _ = await env.reset(0)
    return first, [await env.step(answer) for answer in answers]


def test_a_perfect_episode_earns_one_and_terminates_after_the_last_turn() -> None:
    first, steps = run(_play(CountChainEnv(EnvConfig()), ["25 26 27", " 28 29", "30 31 32"]))
    assert first == "count 25 to 27:"
    assert [s.observation for s in steps] == [" count 28 to 29:", " count 30 to 32:", ""]
    assert [s.terminated for s in steps] == [False, False, True]
    assert not any(s.truncated for s in steps)
    assert sum(s.reward for s in steps) == pytest.approx(1.0)
    assert [s.info["correct"] for s in steps] == [True, True, True]


def test_wrong_answers_earn_nothing_and_the_game_goes_on() -> None:
    _, steps = run(_play(CountChainEnv(EnvConfig()), ["25 26", "28 29", "30 31 33"]))
    assert [s.reward for s in steps] == [0.0, pytest.approx(1 / 3), 0.0]
    assert [s.info["correct"] for s in steps] == [False, True, False]


def test_step_after_the_end_raises_env_error() -> None:
    env = CountChainEnv(EnvConfig(num_turns=1))

    async def scenario() -> None:
        await env.reset(0)
        await env.step("x")
        await env.step("y")

    with pytest.raises(EnvError, match="finished episode"):
        run(scenario())


class _BlockingEcho:
    """A synchronous env: echoes the action, ends after two steps."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.steps = 0
        return f"seed {seed}", {}

    def step(self, action: str) -> StepResult:
        self.steps += 1
        return StepResult(action.upper(), 0.5, self.steps == 2, False, {})


def test_threaded_env_adapts_a_sync_env() -> None:
    env = ThreadedEnv(_BlockingEcho())

    async def scenario() -> list[Any]:
        return [await env.reset(3), await env.step("ab"), await env.step("c")]

    assert run(scenario()) == [
        ("seed 3", {}),
        StepResult("AB", 0.5, False, False, {}),
        ("C", 0.5, True, False, {}),
    ]


def make_echo(config: EnvConfig) -> ThreadedEnv:
    return ThreadedEnv(_BlockingEcho())


def test_registry_builds_builtin_and_dotted_path_envs() -> None:
    assert isinstance(make_env(EnvConfig()), CountChainEnv)
    assert isinstance(make_env(EnvConfig(type=f"{__name__}:make_echo")), ThreadedEnv)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "nope"}, "env.type must be one of 'count_chain'"),
        ({"num_turns": 0}, "env.num_turns must be >= 1"),
        ({"min_span": 3, "max_span": 2}, "env.max_span must be >= env.min_span=3"),
    ],
)
def test_env_config_errors_name_the_key(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvConfig(**kwargs)


def test_env_manager_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="env_manager.stepping must be one of 'async', 'batch'"):
        EnvManagerConfig(stepping="lockstep")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="env_manager.step_timeout_s must be > 0"):
        EnvManagerConfig(step_timeout_s=0)
    with pytest.raises(ValueError, match="group_size=4 must be >= rollout.num_return_sequences=8"):
        check_env_manager_fits(EnvManagerConfig(group_size=4), 8, 2)
    with pytest.raises(ValueError, match="num_env_groups=1 must be >= rollout.rollout_batch_size=2"):
        check_env_manager_fits(EnvManagerConfig(num_env_groups=1, group_size=8), 8, 2)
