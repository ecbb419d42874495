"""The environment seam: gymnasium-shaped text environments, async first.

Key decision: the EnvManager awaits ``reset`` and ``step``, so an environment that waits on a sandbox, a
browser or a remote service never blocks generation. A synchronous environment is adapted by
``ThreadedEnv``, which runs its calls in a worker thread.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Protocol

from asyncrl.types import PlacedRewards


class EnvError(RuntimeError):
    """An environment failed (crashed, lost its sandbox): the EnvManager records it and replaces the env."""


class StepResult(NamedTuple):
    """What ``step`` returns, in gymnasium's order: the next observation (text appended to the context),
    the reward of this step, whether the episode ended by itself (terminated) or was cut off (truncated).

    The reward is credited to the response the step answered: a float on its last token (a per-turn reward),
    ``PlacedRewards`` on the tokens its character offsets into the action text name (per-token rewards)."""

    observation: str
    reward: float | PlacedRewards
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class Env(Protocol):
    """An async text environment; one instance runs one episode at a time."""

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Start an episode determined by ``seed``; returns the first observation and info."""
        ...

    async def step(self, action: str) -> StepResult:
        """Apply the model's response ``action``; raises ``EnvError`` when the environment itself fails."""
        ...


class SyncEnv(Protocol):
    """A blocking text environment (gymnasium-style); wrap it in ``ThreadedEnv`` to use it."""

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> StepResult: ...


class ThreadedEnv:
    """``Env`` over a ``SyncEnv``: each call runs in the default executor, so the event loop stays free."""

    def __init__(self, env: SyncEnv) -> None:
        self.env = env

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return await asyncio.to_thread(self.env.reset, seed)

    async def step(self, action: str) -> StepResult:
        return await asyncio.to_thread(self.env.step, action)
