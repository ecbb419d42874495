"""The proxy a controller mode needs, built one way for real runs and simulated ones.

``multi_version`` gets the orchestrator over migratable engines (an engine that cannot export a request with
its KV, such as vLLM, migrates by recomputing the prefix: proxy/recompute_migration.py), every other mode
an ``LLMProxy`` with the mode's weight-update policy unless ``proxy.update_policy`` names one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from asyncrl.config.proxy import ProxyConfig
from asyncrl.modes import mode_spec
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.proxy.recompute_migration import migratable
from asyncrl.proxy.worker import EngineClient


def proxy_for_mode(
    engines: Sequence[EngineClient],
    config: ProxyConfig,
    mode: str,
    *,
    async_ratio: float,
    slots_per_engine: int,
    clock: Callable[[], float] = time.monotonic,
) -> LLMProxy | MultiVersionProxy:
    """The proxy over ``engines`` for controller ``mode``; engines start at version 0.

    ``async_ratio`` bounds the orchestrator's version window; ``slots_per_engine`` (the requests an
    engine runs at once, ``EngineConfig.slots``) bounds how many calls either proxy sends to one engine (``LLMProxy``: under ``drain``).
    """
    spec = mode_spec(mode)
    if spec.multi_version:
        return MultiVersionProxy(
            [migratable(engine) for engine in engines],
            config,
            async_ratio=async_ratio,
            slots_per_engine=slots_per_engine,
            clock=clock,
        )
    policy_config = replace(config, update_policy=config.update_policy or spec.update_policy)
    return LLMProxy(engines, policy_config, initial_version=0, slots_per_engine=slots_per_engine, clock=clock)
