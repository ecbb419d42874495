"""Text environments for agentic rollout: the async-first ``Env`` protocol, adapters and built-in envs."""

from asyncrl.envs.base import Env, EnvError, StepResult, SyncEnv, ThreadedEnv
from asyncrl.envs.copy_chain import CopyChainEnv
from asyncrl.envs.count_chain import CountChainEnv
from asyncrl.envs.registry import env_factory, make_env

__all__ = [
    "CopyChainEnv",
    "CountChainEnv",
    "Env",
    "EnvError",
    "StepResult",
    "SyncEnv",
    "ThreadedEnv",
    "env_factory",
    "make_env",
]
