"""Shared by the agentic producer tests: run a producer until its first trained group, then shut down cleanly."""

from __future__ import annotations

import asyncio
from typing import Any

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.engine import EngineConfig
from asyncrl.config.env import EnvConfig, EnvManagerConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.engine import make_engine
from asyncrl.envs import make_env
from asyncrl.models.loading import load_model_and_tokenizer
from asyncrl.proxy import LLMProxy
from asyncrl.rollout.agentic_producer import AgenticProducer, make_env_seed_source
from asyncrl.types import Group


async def first_group(producer: AgenticProducer, buffer: SampleBuffer, proxy: LLMProxy) -> Group:
    """The first batch's only group; the buffer closes after it, so the producer's run ends and is awaited."""
    task = asyncio.ensure_future(producer.run())
    (group,) = await buffer.get_batch(0)
    buffer.close()
    await task
    proxy.close()
    return group


def tiny_model_group(
    env: EnvConfig, manager: EnvManagerConfig, max_kv_tokens: int = 1024
) -> tuple[Group, Any]:
    """The first group ``manager.group_size`` episodes of ``env`` give on the shipped tiny-count model through
    the real engine (each group's trajectories all trainable), and the tokenizer."""
    model, tokenizer = load_model_and_tokenizer("tiny-count", device="cpu")
    engine = make_engine(model, tokenizer, EngineConfig(max_running_requests=4, max_kv_tokens=max_kv_tokens))
    size = manager.group_size

    async def main() -> Group:
        proxy = LLMProxy([engine], ProxyConfig(update_policy="drain"))
        buffer = SampleBuffer(BufferConfig(async_ratio=0.0), groups_per_batch=1, group_size=size)
        producer = AgenticProducer(
            source=make_env_seed_source(4, 0),
            proxy=proxy,
            buffer=buffer,
            tokenizer=tokenizer,
            rollout=RolloutConfig(rollout_batch_size=1, num_return_sequences=size, max_new_tokens=24),
            config=manager,
            make_env=lambda: make_env(env),
            seed=0,
        )
        return await first_group(producer, buffer, proxy)

    try:
        return asyncio.run(main()), tokenizer
    finally:
        engine.shutdown()
