"""The built-in copy_chain game, exactly: its turns, rewards, end, misuse and config."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from asyncrl.config.env import EnvConfig
from asyncrl.data.procedural import copy_example
from asyncrl.envs import CopyChainEnv, EnvError, StepResult, make_env
from asyncrl.envs.copy_chain import is_correct, plan_turns

DEFAULT = EnvConfig(type="copy_chain")
SHORT = EnvConfig(type="copy_chain", num_turns=2, median_items=2, length_sigma=0, max_items=4)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_plan_is_a_pure_function_of_the_seed() -> None:
    assert [e.prompt for e in plan_turns(DEFAULT, 0)] == ["copy k g n k u h m p:", "copy x:", "copy t:"]
    assert [e.prompt for e in plan_turns(SHORT, 0)] == ["copy k g:", "copy n k:"]
    assert plan_turns(DEFAULT, 0) == plan_turns(DEFAULT, 0)
    assert plan_turns(DEFAULT, 1)[0].prompt == "copy t g m l q u c a v l t:"


def test_turns_are_the_copy_tasks_own_examples() -> None:
    """Each turn is what the ``copy`` generator makes, so the format is the warm start's token for token."""
    assert [(e.prompt, e.demonstration, e.answer) for e in plan_turns(SHORT, 0)] == [
        ("copy k g:", " k g", "k g"),
        ("copy n k:", " n k", "n k"),
    ]


def test_item_counts_stay_within_max_items() -> None:
    config = EnvConfig(type="copy_chain", num_turns=50, median_items=3, length_sigma=2, max_items=4)
    counts = {len(e.answer.split()) for e in plan_turns(config, 3)}
    assert counts <= {1, 2, 3, 4} and 4 in counts and 1 in counts


async def _play(env: CopyChainEnv, answers: list[str]) -> tuple[str, dict[str, Any], list[StepResult]]:
    first, info = await env.reset(0)
    return first, info, [await env.step(answer) for answer in answers]


def test_a_perfect_episode_earns_one_and_terminates_after_the_last_turn() -> None:
    first, info, steps = run(_play(CopyChainEnv(DEFAULT), [" k g n k u h m p", "x", " t\n"]))
    assert (first, info) == ("copy k g n k u h m p:", {"num_turns": 3})
    assert [s.observation for s in steps] == ["copy x:", "copy t:", ""]
    assert [s.terminated for s in steps] == [False, False, True]
    assert not any(s.truncated for s in steps)
    assert sum(s.reward for s in steps) == pytest.approx(1.0)
    assert [s.info["correct"] for s in steps] == [True, True, True]


def test_wrong_answers_earn_nothing_and_the_game_goes_on() -> None:
    _, _, steps = run(_play(CopyChainEnv(DEFAULT), [" k g n k u h m", " x", " t t"]))
    assert [s.reward for s in steps] == [0.0, pytest.approx(1 / 3), 0.0]
    assert [s.info["correct"] for s in steps] == [False, True, False]
    assert [s.observation for s in steps] == ["copy x:", "copy t:", ""]


def test_is_correct_compares_words_exactly() -> None:
    example = copy_example(random.Random(0), 3)
    assert example.answer == "v t k"
    assert is_correct(" v t k", example) and is_correct("v  t k\n", example)
    assert not is_correct(" vt k", example) and not is_correct(" v t k v", example)
    assert not is_correct("", example)


def test_reset_starts_a_new_episode() -> None:
    env = CopyChainEnv(SHORT)

    async def scenario() -> tuple[str, float]:
        await env.reset(0)
        await env.step("k g")
        first, _ = await env.reset(0)
        return first, (await env.step("k g")).reward

    assert run(scenario()) == ("copy k g:", 0.5)


def test_step_before_reset_or_after_the_end_raises_env_error() -> None:
    with pytest.raises(EnvError, match="copy_chain: step\\(\\) called on a finished episode"):
        run(CopyChainEnv(SHORT).step("k g"))
    env = CopyChainEnv(EnvConfig(type="copy_chain", num_turns=1))

    async def scenario() -> None:
        await env.reset(0)
        await env.step("x")
        await env.step("y")

    with pytest.raises(EnvError, match="finished episode"):
        run(scenario())


def test_registry_builds_copy_chain() -> None:
    assert isinstance(make_env(SHORT), CopyChainEnv)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"type": "copy"},
            "env.type must be one of 'count_chain', 'copy_chain', 'sokoban', .* or a dotted path",
        ),
        ({"max_items": 0}, "env.max_items must be >= 1, got 0"),
        ({"median_items": 0.5}, r"env.median_items must be in \[1, env.max_items=40\], got 0.5"),
        ({"median_items": 5, "max_items": 4}, r"env.median_items must be in \[1, env.max_items=4\], got 5"),
        ({"length_sigma": -0.1}, "env.length_sigma must be >= 0, got -0.1"),
    ],
)
def test_copy_chain_config_errors_name_the_key(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvConfig(**{"type": "copy_chain", **kwargs})
