"""Redundant prompts are aborted on the engines as soon as their batch is full, while the trainer trains it
(not after the step), and recorded as aborted: the real producer, buffer, proxy and controller on fakes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from controller_harness import FakeRewards, FakeTokenizer

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.controller import Controller
from asyncrl.data.base import TaskSample
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine
from asyncrl.types import FinishReason, Generation, Group

BATCH, GROUP, REDUNDANT = 2, 2, 2


class CountingEngine(FakeEngine):
    """A fake engine that sets ``all_aborted`` once ``expected`` of its requests were aborted."""

    def __init__(self, expected: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.aborted: list[str] = []
        self.expected = expected
        self.all_aborted = asyncio.Event()

    async def abort(self, request_id: str) -> Generation | None:
        generation = await super().abort(request_id)
        if generation is not None and generation.finish_reason is FinishReason.ABORT:
            self.aborted.append(request_id)
            if len(self.aborted) == self.expected:
                self.all_aborted.set()
        return generation


class TrainerWaitingForAborts:
    """Trains only once the surplus requests are aborted (within a deadline): proves they were aborted while
    the batch trained, not at the weight sync after it."""

    def __init__(self, engine: CountingEngine) -> None:
        self.engine = engine
        self.batches: list[list[str]] = []

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        await asyncio.wait_for(self.engine.all_aborted.wait(), timeout=600)
        self.batches.append(sorted(group.prompt_uid for group in groups))
        return {}

    async def state_for_sync(self) -> dict[str, int]:
        return {}


def test_surplus_requests_are_aborted_on_the_engine_when_the_batch_is_full():
    async def main() -> None:
        samples = [
            TaskSample(uid=uid, prompt=uid, answer="0") for uid in ("fast0", "fast1", "slow0", "slow1")
        ]
        engine = CountingEngine(
            REDUNDANT * GROUP, lengths=lambda rid: 2 if rid.startswith("fast") else 1000, step_s=1.0
        )
        proxy = LLMProxy([engine], ProxyConfig(update_policy="drain"), clock=asyncio.get_running_loop().time)
        buffer = SampleBuffer(
            BufferConfig(async_ratio=0.0, get_batch_timeout_s=10_000.0),
            groups_per_batch=BATCH,
            group_size=GROUP,
            max_redundant_groups=REDUNDANT,
        )
        rollout = RolloutConfig(
            rollout_batch_size=BATCH,
            num_return_sequences=GROUP,
            max_new_tokens=1000,
            max_additional_running_prompts=REDUNDANT,
        )
        source = PromptSource(samples, seed=0)
        producer = RLVRProducer(
            source=source,
            proxy=proxy,
            rewards=FakeRewards(random.Random(0)),
            buffer=buffer,
            tokenizer=FakeTokenizer(),
            config=rollout,
            seed=0,
        )
        trainer = TrainerWaitingForAborts(engine)
        controller = Controller(
            config=ControllerConfig(mode="sync", num_steps=1),
            buffer=buffer,
            producer=producer,
            source=source,
            trainer=trainer,
            proxy=proxy,
        )
        await controller.run(1)
        proxy.close()
        assert trainer.batches == [["fast0@0", "fast1@0"]]
        assert sorted(engine.aborted) == ["slow0@0#0", "slow0@0#1", "slow1@0#0", "slow1@0#1"]
        accounting = buffer.accounting()
        assert (accounting.num_admitted, accounting.num_dropped.get("aborted")) == (4, 2)
        assert producer.counts["aborted_requests"] == REDUNDANT * GROUP

    for seed in range(20):
        run_shuffled(main, seed, virtual_time=True)
