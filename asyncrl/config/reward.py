"""Configuration of rewards: which function verifies a response, and how the reward service runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EXECUTORS = ("thread", "process")


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """The reward function and the concurrency, isolation and timeout of the service that runs it."""

    name: str = ""
    """A registered reward (exact_match, math_equiv, format, reasoning_gym) or a user function as
    ``pkg.module:function``; empty: each sample's own default (the task's verifier)."""
    format_weight: float = 0.0
    """Weight of the ``format`` reward added to the main reward; 0 disables it."""
    timeout_s: float = 10.0
    """Seconds one reward call may take (queueing included); past it the sample is marked failed."""
    executor: Literal["thread", "process"] = "thread"
    """Where reward calls run: a thread pool (cheap, shares memory) or a process pool (isolated,
    killable on timeout; the function must be importable)."""
    max_workers: int = 2
    """Reward calls that run at once."""

    def __post_init__(self) -> None:
        if self.format_weight < 0:
            raise ValueError(f"reward.format_weight must be >= 0, got {self.format_weight}")
        if self.timeout_s <= 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {self.timeout_s}")
        if self.executor not in EXECUTORS:
            raise ValueError(
                f"reward.executor must be one of {', '.join(map(repr, EXECUTORS))}, got {self.executor!r}"
            )
        if self.max_workers < 1:
            raise ValueError(f"reward.max_workers must be >= 1, got {self.max_workers}")
        if self.name and not _is_name_or_path(self.name):
            raise ValueError(
                f"reward.name must be a registered name or 'pkg.module:function', got {self.name!r}"
            )


def _is_name_or_path(name: str) -> bool:
    module, sep, attr = name.partition(":")
    if not sep:
        return name.isidentifier()
    return bool(attr) and attr.isidentifier() and all(p.isidentifier() for p in module.split("."))
