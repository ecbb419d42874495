"""Configuration of rewards: which function verifies a response, and how the reward service runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.sandbox import SandboxConfig

EXECUTORS = ("thread", "process")
CODE_SCORINGS = ("fraction", "all_or_nothing")


@dataclass(frozen=True, kw_only=True)
class CodeRewardConfig:
    """How the ``code`` reward grades a program and the sandbox it runs the program in."""

    scoring: Literal["fraction", "all_or_nothing"] = "fraction"
    """fraction: reward = share of the sample's tests passed; all_or_nothing: 1 only if every test passes."""
    test_timeout_s: float = 1.0
    """Seconds one test (or loading the program) may take inside the sandbox before it counts as failed."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Limits of the sandbox; its ``timeout_s`` bounds one sample's whole run (keep it below
    ``reward.timeout_s`` so the sandbox, not the service, reports the timeout)."""

    def __post_init__(self) -> None:
        if self.scoring not in CODE_SCORINGS:
            raise ValueError(
                f"reward.code.scoring must be one of {', '.join(map(repr, CODE_SCORINGS))}, got {self.scoring!r}"
            )
        if self.test_timeout_s <= 0:
            raise ValueError(f"reward.code.test_timeout_s must be > 0, got {self.test_timeout_s}")


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """The reward function and the concurrency, isolation and timeout of the service that runs it."""

    name: str = ""
    """A registered reward (exact_match, math_equiv, format, reasoning_gym, code) or a user function as
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
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """The ``code`` reward's grading and sandbox (used only when a sample's reward is ``code``)."""

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
