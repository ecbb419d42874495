"""Reward functions by name: built-ins register themselves; ``pkg.module:function`` imports a user one.

A reward function is ``reward_fn(response_text, sample) -> float`` or ``-> (float, info_dict)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from asyncrl.data.base import TaskSample

RewardOutput = float | tuple[float, dict[str, Any]]
RewardFn = Callable[[str, TaskSample], RewardOutput]

_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name`` (import time only; names are unique)."""

    def decorate(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY:
            raise ValueError(f"reward {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return decorate


def registered_rewards() -> list[str]:
    """Names of the registered rewards, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_reward(name: str) -> RewardFn:
    """The reward registered as ``name``, or the function at the import path ``pkg.module:function``."""
    if ":" in name:
        return _import_reward(name)
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(
            f"reward.name must be one of {', '.join(sorted(_REGISTRY))} or 'pkg.mod:fn', got {name!r}"
        )
    return _REGISTRY[name]


def _import_reward(path: str) -> RewardFn:
    module_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"reward.name {path!r} cannot be imported: {err}") from err
    if not callable(fn):
        raise ValueError(f"reward.name {path!r} is not callable")
    return fn


def _load_builtins() -> None:
    import asyncrl.rewards.builtin  # noqa: F401  (registers the built-ins on first import)
