"""``make_env(config)``: the environment ``env.type`` names, built-in or a user factory by dotted path."""

from __future__ import annotations

import importlib

from asyncrl.config.env import EnvConfig
from asyncrl.envs.base import Env
from asyncrl.envs.copy_chain import CopyChainEnv
from asyncrl.envs.count_chain import CountChainEnv


def make_env(config: EnvConfig) -> Env:
    """A fresh environment instance (one per EnvManager; a failed one is replaced by another call)."""
    if config.type == "count_chain":
        return CountChainEnv(config)
    if config.type == "copy_chain":
        return CopyChainEnv(config)
    module_name, _, attr = config.type.partition(":")
    return getattr(importlib.import_module(module_name), attr)(config)
