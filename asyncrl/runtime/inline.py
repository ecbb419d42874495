"""The inline runtime: every part in one process — engines on their own threads, the trainer on another.

Key decision: the trainer and each engine hold their own copy of the model, exactly as they would in separate
processes, so weights reach the engines only through ``model_update`` (the seam every runtime shares) and a
test of this runtime exercises the real weight-sync path.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.run import RunConfig
from asyncrl.controller.controller import Controller
from asyncrl.engine import make_engine
from asyncrl.envs import make_env
from asyncrl.models.loading import load_model_and_tokenizer
from asyncrl.proxy.factory import proxy_for_mode
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.rewards.service import RewardService
from asyncrl.rollout.agentic_producer import AgenticProducer, make_env_seed_source
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.tasks.base import Task
from asyncrl.tasks.registry import make_task
from asyncrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group

if TYPE_CHECKING:
    from asyncrl.rollout.external_producer import ExternalProducer

ENV_SEEDS_PER_EPOCH = 1024
"""Env-seed slots of an agentic run's prompt source: the epoch's shuffle order over them. Every admission's
key (slot and epoch) hashes to its own env seed, so the count sets only how often the order reshuffles."""


class LocalTrainer:
    """The in-process trainer behind the same facade as the Ray trainer client (blocking calls; the controller
    runs them in a worker thread through ``AwaitableTrainer``)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def version(self) -> int:
        return self.trainer.version

    def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        return self.trainer.train_step(groups, policy_version)

    def state_for_sync(self) -> dict[str, Any]:
        return self.trainer.state_for_sync()

    def save_checkpoint(self, root: str | Path, *, extra: dict[str, Any], keep_last: int | None) -> Path:
        return save_checkpoint(root, self.trainer, extra=extra, keep_last=keep_last)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return load_checkpoint(path, self.trainer)

    def shutdown(self) -> None:
        """Nothing to stop: the trainer lives in this process."""


class AwaitableTrainer:
    """Adapts a blocking trainer facade (local or Ray) to the controller's awaitable ``TrainerClient`` seam:
    steps run in a worker thread so the event loop (producers, proxy) keeps running meanwhile."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        return await asyncio.to_thread(self.trainer.train_step, groups, policy_version)

    async def state_for_sync(self) -> Any:
        return await asyncio.to_thread(self.trainer.state_for_sync)


@dataclass
class InlineParts:
    """The long-lived parts of a run (built once, reused by every controller run and evaluation)."""

    config: RunConfig
    task: Task
    tokenizer: Any
    trainer: LocalTrainer
    engines: list[Any]
    rewards: RewardService

    def close(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self.rewards.close()


class Parts(Protocol):
    """What a runtime builds (``InlineParts`` here, ``RayParts`` in ``ray_runtime``): the controller and the
    training driver see only this."""

    config: RunConfig
    task: Task
    tokenizer: Any
    trainer: Any
    engines: list[Any]
    rewards: RewardService

    def close(self) -> None: ...


def build_parts(config: RunConfig) -> InlineParts:
    """Load the model once, then give the trainer and every engine its own copy."""
    model, tokenizer = load_model_and_tokenizer(config.model.path, config.model.dtype, config.model.device)
    ref_model = copy.deepcopy(model) if config.loss.needs_reference else None
    engines = [
        make_engine(copy.deepcopy(model), tokenizer, config.engine) for _ in range(config.rollout.num_engines)
    ]
    trainer = Trainer(
        model,
        config.trainer,
        config.loss,
        config.advantage,
        ref_model,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )
    return InlineParts(
        config=config,
        task=make_task(config.task),
        tokenizer=tokenizer,
        trainer=LocalTrainer(trainer),
        engines=engines,
        rewards=RewardService.from_config(config.reward),
    )


def make_proxy(parts: Parts) -> LLMProxy | MultiVersionProxy:
    """The proxy the mode needs over the engines (``asyncrl.proxy.factory``). Engines start from the loaded
    model, version 0; a resumed trainer's weights reach them through the first ``model_update``."""
    cfg = parts.config
    return proxy_for_mode(
        parts.engines,
        cfg.proxy,
        cfg.controller.mode,
        async_ratio=cfg.buffer.async_ratio,
        slots_per_engine=cfg.engine.max_running_requests,
    )


def make_source(config: RunConfig, task: Task) -> PromptSource:
    """The training stream: the task's train split, or (agentic, external) group slots."""
    if config.producer in ("agentic", "external"):
        return make_env_seed_source(ENV_SEEDS_PER_EPOCH, config.seed)
    return PromptSource(task.split("train"), seed=config.seed)


def make_buffer(config: RunConfig, trainer_version: int) -> SampleBuffer:
    """The buffer; groups admitted beyond the async ratio are redundant prompts (rlvr) or env groups
    beyond the batch (agentic)."""
    if config.producer == "agentic":
        assert config.env_manager is not None  # RunConfig fills it for producer 'agentic'
        redundant = config.env_manager.num_env_groups - config.rollout.rollout_batch_size
    else:
        redundant = config.rollout.max_additional_running_prompts
    buffer = SampleBuffer(
        config.buffer,
        groups_per_batch=config.rollout.rollout_batch_size,
        group_size=config.rollout.num_return_sequences,
        max_redundant_groups=redundant,
    )
    buffer.on_trainer_version(trainer_version)
    return buffer


def make_producer(
    parts: Parts, proxy: LLMProxy | MultiVersionProxy, buffer: SampleBuffer, source: PromptSource
) -> RLVRProducer | AgenticProducer | ExternalProducer:
    """The producer ``producer`` names, feeding ``buffer`` from ``source`` through ``proxy``."""
    cfg = parts.config
    if cfg.producer == "external":
        from asyncrl.rollout.external_producer import ExternalProducer

        assert cfg.serve is not None  # RunConfig fills it
        return ExternalProducer(
            source=source,
            proxy=proxy,
            buffer=buffer,
            tokenizer=parts.tokenizer,
            config=cfg.serve,
            output_dir=cfg.output_dir,
            seed=cfg.seed,
        )
    if cfg.producer == "agentic":
        assert cfg.env is not None and cfg.env_manager is not None  # RunConfig fills them
        return AgenticProducer(
            source=source,
            proxy=proxy,
            buffer=buffer,
            tokenizer=parts.tokenizer,
            rollout=cfg.rollout,
            config=cfg.env_manager,
            make_env=functools.partial(make_env, cfg.env),
            seed=cfg.seed,
        )
    return RLVRProducer(
        source=source,
        proxy=proxy,
        rewards=parts.rewards,
        buffer=buffer,
        tokenizer=parts.tokenizer,
        config=cfg.rollout,
        seed=cfg.seed,
    )


def make_controller(
    parts: Parts,
    proxy: LLMProxy | MultiVersionProxy,
    source: PromptSource,
    on_step: Any = lambda record: None,
) -> Controller:
    """The buffer, producer and controller of one training run over already-built parts."""
    buffer = make_buffer(parts.config, parts.trainer.version)
    return Controller(
        config=parts.config.controller,
        buffer=buffer,
        producer=make_producer(parts, proxy, buffer, source),
        source=source,
        trainer=AwaitableTrainer(parts.trainer),
        proxy=proxy,
        on_step=on_step,
        start_version=parts.trainer.version,
    )
