"""``copy_chain``: a multi-turn copying game in the exact format the default ``tiny-copy`` model learned.

Each turn asks a ``copy k q b:`` prompt built by the ``copy`` task's own generator (lowercase letters, a
long-tailed number of them), so turn 1 is token for token a prompt of the supervised warm start. Every exact
answer earns 1 / num_turns; an episode's return is the fraction of turns answered right, and the whole
episode is a pure function of the seed.

Key decision: the next turn's observation is the bare prompt, with no separator. A response that stops on
its own ends with the EOS token, which the context keeps, and the warm start saw every prompt begin a
sequence: after ``... k q b<|endoftext|>`` the tokens ``copy t m:`` are exactly a warm-start prompt's.
"""

from __future__ import annotations

import random
from typing import Any

from asyncrl.config.env import EnvConfig
from asyncrl.data.lengths import long_tail_count
from asyncrl.data.procedural import Example, copy_example
from asyncrl.envs.base import EnvError, StepResult


def plan_turns(config: EnvConfig, seed: int) -> list[Example]:
    """The ``copy`` example of every turn of the episode ``seed``, item counts drawn as the task draws them."""
    rng = random.Random(seed)
    turns = []
    for _ in range(config.num_turns):
        num_items = long_tail_count(
            rng, median=config.median_items, sigma=config.length_sigma, max_items=config.max_items
        )
        turns.append(copy_example(rng, num_items))
    return turns


def is_correct(action: str, example: Example) -> bool:
    """The answer is right when its whitespace-separated words are exactly the letters asked for."""
    return action.split() == example.answer.split()


class CopyChainEnv:
    """The game above; ``reset`` must come before ``step``, and ``step`` after the end raises ``EnvError``."""

    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        self._turns: list[Example] = []
        self._turn = 0

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._turns = plan_turns(self.config, seed)
        self._turn = 0
        return self._turns[0].prompt, {"num_turns": len(self._turns)}

    async def step(self, action: str) -> StepResult:
        if self._turn >= len(self._turns):
            raise EnvError("copy_chain: step() called on a finished episode (reset first)")
        correct = is_correct(action, self._turns[self._turn])
        self._turn += 1
        done = self._turn == len(self._turns)
        observation = "" if done else self._turns[self._turn].prompt
        reward = 1.0 / len(self._turns) if correct else 0.0
        return StepResult(observation, reward, done, False, {"correct": correct})
