"""Reward functions by name: built-ins register themselves; ``pkg.module:function`` imports a user one.

A reward function is ``reward_fn(response_text, sample) -> float`` or ``-> (float, info_dict)``; in place of
the float it may return ``asyncrl.types.PlacedRewards`` to credit parts of the response (per-token or per-step
rewards, by character offset): GAE then sees each where it falls, group estimators their total. A reward
that needs setup from the reward config (the ``code`` reward's sandbox) registers a factory instead:
``factory(reward_config) -> reward_fn``; callers build it once and keep it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from asyncrl.config.reward import RewardConfig
from asyncrl.data.base import TaskSample
from asyncrl.types import PlacedRewards

RewardOutput = float | PlacedRewards | tuple[float | PlacedRewards, dict[str, Any]]
RewardFn = Callable[[str, TaskSample], RewardOutput]
RewardFactory = Callable[[RewardConfig], RewardFn]

_REGISTRY: dict[str, RewardFn] = {}
_FACTORIES: dict[str, RewardFactory] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name`` (import time only; names are unique)."""

    def decorate(fn: RewardFn) -> RewardFn:
        _check_new(name)
        _REGISTRY[name] = fn
        return fn

    return decorate


def register_reward_factory(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator registering ``factory(reward_config) -> reward_fn`` under ``name`` (import time only)."""

    def decorate(factory: RewardFactory) -> RewardFactory:
        _check_new(name)
        _FACTORIES[name] = factory
        return factory

    return decorate


def _check_new(name: str) -> None:
    if name in _REGISTRY or name in _FACTORIES:
        raise ValueError(f"reward {name!r} is already registered")


def registered_rewards() -> list[str]:
    """Names of the registered rewards, sorted."""
    _load_builtins()
    return sorted([*_REGISTRY, *_FACTORIES])


def get_reward(name: str, config: RewardConfig | None = None) -> RewardFn:
    """The reward registered as ``name`` (a factory's is built from ``config`` now: keep the result), or the
    function at the import path ``pkg.module:function``."""
    if ":" in name:
        return _import_reward(name)
    _load_builtins()
    if name in _FACTORIES:
        return _FACTORIES[name](config or RewardConfig())
    if name not in _REGISTRY:
        raise ValueError(
            f"reward.name must be one of {', '.join(registered_rewards())} or 'pkg.mod:fn', got {name!r}"
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
