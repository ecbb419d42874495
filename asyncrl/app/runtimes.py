"""A run's parts per runtime (inline: one process; local/cluster: Ray actors) and their wiring into a controller.

``runtime_parts(config)`` is the one assembly function per runtime; ``assemble_controller`` wires the parts
through ``app.wiring``, the same functions the simulator uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from asyncrl.app.wiring import Proxy, make_buffer, make_controller, make_producer
from asyncrl.config.run import RunConfig
from asyncrl.controller.controller import Controller, StepRecord
from asyncrl.data.base import Task
from asyncrl.envs import env_factory
from asyncrl.proxy.factory import proxy_for_mode
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.recovery import EngineFactory, as_published
from asyncrl.rewards.service import RewardService
from asyncrl.rollout.agentic_producer import make_env_seed_source
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.runtime.inline import AwaitableTrainer, build_parts

ENV_SEEDS_PER_EPOCH = 1024
"""Env-seed slots of an agentic run's prompt source: the epoch's shuffle order over them. Every admission's
key (slot and epoch) hashes to its own env seed, so the count sets only how often the order reshuffles."""


class Parts(Protocol):
    """What a runtime builds (``runtime.inline.InlineParts``, ``runtime.ray_runtime.RayParts``): the
    controller and the training driver see only this."""

    config: RunConfig
    task: Task
    tokenizer: Any
    trainer: Any
    engines: list[Any]
    rewards: RewardService
    engine_factory: EngineFactory | None
    """Starts an engine in place of a dead or wedged one (the proxy's recovery); None: no recovery."""

    def locations(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def runtime_parts(config: RunConfig) -> Iterator[Parts]:
    """The run's parts in the runtime ``config.runtime.type`` names; Ray is imported only when asked for."""
    if config.runtime.type == "inline":
        parts: Parts = build_parts(config)
        try:
            yield parts
        finally:
            parts.close()
        return
    from asyncrl.runtime.ray_runtime import build_ray_parts, ray_session

    with ray_session(config.runtime):
        parts = build_ray_parts(config, config.runtime)
        try:
            yield parts
        finally:
            parts.close()


def make_proxy(parts: Parts) -> Proxy:
    """The proxy the mode needs over the engines (``asyncrl.proxy.factory``). Engines start from the loaded
    model, version 0; a resumed trainer's weights reach them through the first ``model_update``. Dead or
    wedged engines are replaced where the runtime can start engines and the proxy is an ``LLMProxy`` (the
    multi_version orchestrator moves a sick engine's requests away but does not replace it yet)."""
    cfg = parts.config
    proxy = proxy_for_mode(
        parts.engines,
        cfg.proxy,
        cfg.controller.mode,
        async_ratio=cfg.buffer.async_ratio,
        slots_per_engine=cfg.engine.slots(),
    )
    if isinstance(proxy, LLMProxy) and parts.engine_factory is not None:
        # runtime.switch: the trainer lets go of each update once applied; a replacement gets it packed again
        proxy.enable_recovery(parts.engine_factory, getattr(parts.trainer, "catch_up", as_published))
    return proxy


def make_source(config: RunConfig, task: Task) -> PromptSource:
    """The training stream: the task's train split, or (agentic, external) group slots."""
    if config.producer in ("agentic", "external"):
        return make_env_seed_source(ENV_SEEDS_PER_EPOCH, config.seed)
    return PromptSource(task.split("train"), seed=config.seed)


def assemble_controller(
    parts: Parts,
    proxy: Proxy,
    source: PromptSource,
    on_step: Callable[[StepRecord], Awaitable[None] | None] = lambda record: None,
    after_sync: Callable[[int], Awaitable[None]] | None = None,
) -> Controller:
    """The buffer, producer and controller of one training run over already-built parts."""
    cfg = parts.config
    buffer = make_buffer(
        cfg.buffer,
        cfg.rollout,
        producer=cfg.producer,
        env_manager=cfg.env_manager,
        trainer_version=parts.trainer.version,
    )
    producer = make_producer(
        cfg.producer,
        source=source,
        proxy=proxy,
        buffer=buffer,
        tokenizer=parts.tokenizer,
        rollout=cfg.rollout,
        seed=cfg.seed,
        rewards=parts.rewards,
        env_manager=cfg.env_manager,
        make_env=env_factory(cfg.env) if cfg.producer == "agentic" else None,
        serve=cfg.serve,
        output_dir=cfg.output_dir,
        chat_template_kwargs=cfg.task.chat_template_kwargs,
    )
    return make_controller(
        cfg.controller,
        buffer=buffer,
        producer=producer,
        trainer=AwaitableTrainer(parts.trainer),
        proxy=proxy,
        on_step=on_step,
        after_sync=after_sync,
        start_version=parts.trainer.version,
    )
