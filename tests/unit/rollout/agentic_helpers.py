"""Shared by the agentic producer tests: run a producer until its first trained group, then shut down cleanly."""

from __future__ import annotations

import asyncio

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.proxy import LLMProxy
from asyncrl.rollout.agentic_producer import AgenticProducer
from asyncrl.types import Group


async def first_group(producer: AgenticProducer, buffer: SampleBuffer, proxy: LLMProxy) -> Group:
    """The first batch's only group; the buffer closes after it, so the producer's run ends and is awaited."""
    task = asyncio.ensure_future(producer.run())
    (group,) = await buffer.get_batch(0)
    buffer.close()
    await task
    proxy.close()
    return group
