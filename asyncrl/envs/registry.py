"""``make_env(config)``: the environment ``env.type`` names, built-in or a user factory by dotted path, wrapped in
the latency/fault injector when ``env.faults`` asks for it; ``env_factory`` numbers the instances it makes."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable

from asyncrl.config.env import EnvConfig
from asyncrl.envs.base import Env, ThreadedEnv
from asyncrl.envs.copy_chain import CopyChainEnv
from asyncrl.envs.count_chain import CountChainEnv
from asyncrl.envs.faults import FaultyEnv


def make_env(config: EnvConfig, instance: int = 0) -> Env:
    """A fresh environment instance (one per EnvManager; a failed one is replaced by another call).
    ``instance`` picks the fault injector's random stream, so instances do not fail in unison."""
    env = _make_base_env(config)
    return FaultyEnv(env, config.faults, instance) if config.faults.active else env


def env_factory(config: EnvConfig) -> Callable[[], Env]:
    """A ``make_env`` for the EnvManagers of one run: each call builds the next numbered instance."""
    counter = itertools.count()
    return lambda: make_env(config, next(counter))


def _make_base_env(config: EnvConfig) -> Env:
    if config.type == "count_chain":
        return CountChainEnv(config)
    if config.type == "copy_chain":
        return CopyChainEnv(config)
    if config.type == "sokoban":
        from asyncrl.envs.sokoban import SokobanEnv

        return SokobanEnv(config)
    if config.type == "tool_use":
        from asyncrl.envs.tool_use import ToolUseEnv

        return ToolUseEnv(config)
    if config.type == "gymnasium":
        from asyncrl.envs.gymnasium_env import GymnasiumEnv

        return ThreadedEnv(GymnasiumEnv(config))
    module_name, _, attr = config.type.partition(":")
    return getattr(importlib.import_module(module_name), attr)(config)
