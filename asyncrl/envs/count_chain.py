"""``count_chain``: a multi-turn counting game the tiny default model can play.

Each turn asks ``count A to B:`` and expects the numbers A..B separated by spaces (the default ``count``
task's format, so the warm-started tiny model already plays it); the next turn continues from B + 1. Every
exact answer earns 1 / num_turns, so an episode's return is the fraction of turns answered right. The whole
episode is a pure function of the seed.
"""

from __future__ import annotations

import random
from typing import Any

from asyncrl.config.env import EnvConfig
from asyncrl.envs.base import EnvError, StepResult


def count_prompt(start: int, end: int) -> str:
    return f"count {start} to {end}:"


def expected_answer(start: int, end: int) -> str:
    return " ".join(str(n) for n in range(start, end + 1))


def is_correct(action: str, start: int, end: int) -> bool:
    """The answer is right when its whitespace-separated words are exactly start..end."""
    return action.split() == expected_answer(start, end).split()


def plan_turns(config: EnvConfig, seed: int) -> list[tuple[int, int]]:
    """The (start, end) of every turn of the episode ``seed``: consecutive ranges from a random start."""
    rng = random.Random(seed)
    start = rng.randint(1, config.max_start)
    turns = []
    for _ in range(config.num_turns):
        end = start + rng.randint(config.min_span, config.max_span) - 1
        turns.append((start, end))
        start = end + 1
    return turns


class CountChainEnv:
    """The game above; ``reset`` must come before ``step``, and ``step`` after the end raises ``EnvError``."""

    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        self._turns: list[tuple[int, int]] = []
        self._turn = 0

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._turns = plan_turns(self.config, seed)
        self._turn = 0
        return count_prompt(*self._turns[0]), {"num_turns": len(self._turns)}

    async def step(self, action: str) -> StepResult:
        if self._turn >= len(self._turns):
            raise EnvError("count_chain: step() called on a finished episode (reset first)")
        start, end = self._turns[self._turn]
        correct = is_correct(action, start, end)
        self._turn += 1
        done = self._turn == len(self._turns)
        observation = "" if done else " " + count_prompt(*self._turns[self._turn])
        reward = 1.0 / len(self._turns) if correct else 0.0
        return StepResult(observation, reward, done, False, {"correct": correct})
