"""The one wiring of a run: buffer, producer and controller over engines, trainer and rewards of any kind.

Key decision: real runs (``app.train``, inline or Ray) and simulated ones (``app.simulate``) call these same
functions; only the workers handed in differ (real engines and trainer, or cost models), so the simulator
cannot drift from the real wiring.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.env import EnvManagerConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.controller import Controller, StepRecord
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.rollout.agentic_producer import AgenticProducer
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer

Proxy = LLMProxy | MultiVersionProxy
Producer = RLVRProducer | AgenticProducer


def redundant_groups(producer: str, rollout: RolloutConfig, env_manager: EnvManagerConfig | None) -> int:
    """Groups admitted beyond what the async ratio allows: redundant prompts (rlvr) or env groups beyond the
    batch (agentic)."""
    if producer == "agentic":
        assert env_manager is not None  # the configs fill it for producer 'agentic'
        return env_manager.num_env_groups - rollout.rollout_batch_size
    return rollout.max_additional_running_prompts


def make_buffer(
    buffer: BufferConfig,
    rollout: RolloutConfig,
    *,
    producer: str,
    env_manager: EnvManagerConfig | None,
    trainer_version: int = 0,
) -> SampleBuffer:
    """The sample buffer of a run whose trainer is at ``trainer_version`` (> 0 on resume: capacity then opens
    exactly as far as an uninterrupted run's, see ``SampleBuffer``)."""
    sample_buffer = SampleBuffer(
        buffer,
        groups_per_batch=rollout.rollout_batch_size,
        group_size=rollout.num_return_sequences,
        max_redundant_groups=redundant_groups(producer, rollout, env_manager),
        start_version=trainer_version,
    )
    return sample_buffer


def make_producer(
    producer: str,
    *,
    source: PromptSource,
    proxy: Proxy,
    buffer: SampleBuffer,
    tokenizer: Any,
    rollout: RolloutConfig,
    seed: int,
    rewards: Any = None,
    env_manager: EnvManagerConfig | None = None,
    make_env: Callable[..., Any] | None = None,
    serve: Any = None,
    output_dir: str = "",
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Producer:
    """The producer ``producer`` names, feeding ``buffer`` from ``source`` through ``proxy``: rlvr needs
    ``rewards``, agentic ``env_manager`` and ``make_env``, external ``serve`` (the endpoint's config),
    ``output_dir`` (where it writes ``endpoint.json``) and the endpoint's ``chat_template_kwargs``."""
    if producer == "external":
        from asyncrl.rollout.external_producer import ExternalProducer

        assert serve is not None  # RunConfig fills it for producer 'external'
        return ExternalProducer(
            source=source,
            proxy=proxy,
            buffer=buffer,
            tokenizer=tokenizer,
            config=serve,
            output_dir=output_dir,
            seed=seed,
            chat_template_kwargs=chat_template_kwargs,
        )
    if producer == "agentic":
        assert env_manager is not None and make_env is not None
        return AgenticProducer(
            source=source,
            proxy=proxy,
            buffer=buffer,
            tokenizer=tokenizer,
            rollout=rollout,
            config=env_manager,
            make_env=make_env,
            seed=seed,
        )
    return RLVRProducer(
        source=source,
        proxy=proxy,
        rewards=rewards,
        buffer=buffer,
        tokenizer=tokenizer,
        config=rollout,
        seed=seed,
    )


def make_controller(
    config: ControllerConfig,
    *,
    buffer: SampleBuffer,
    producer: Producer,
    trainer: Any,
    proxy: Proxy,
    on_step: Callable[[StepRecord], Awaitable[None] | None] = lambda record: None,
    after_sync: Callable[[int], Awaitable[None]] | None = None,
    start_version: int = 0,
) -> Controller:
    """The controller over the wired parts; ``trainer`` is the awaitable ``TrainerClient`` seam."""
    return Controller(
        config=config,
        buffer=buffer,
        producer=producer,
        source=producer.source,
        trainer=trainer,
        proxy=proxy,
        on_step=on_step,
        after_sync=after_sync,
        start_version=start_version,
    )
