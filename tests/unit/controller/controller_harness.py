"""A whole training run on fakes: the real producer, buffer, proxy and controller against scripted engines,
rewards and trainer on (virtual) loop time, with a ledger of every prompt's end."""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.controller import Controller
from asyncrl.data.base import TaskSample
from asyncrl.modes import async_ratio_for, mode_spec
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.rewards.service import RewardResult, RewardStatus
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.testing.fake_engine import FakeEngine
from asyncrl.testing.ledger import Ledger
from asyncrl.types import Group


def long_tail_length(request_id: str) -> int:
    """1..48 tokens, most short and a few ~20x longer, fixed per request id."""
    u = (zlib.crc32(request_id.encode()) % 10_000) / 10_000
    return min(48, 1 + int(1.5 / (1.0 - 0.97 * u)))


class FakeTokenizer:
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [1 + (ord(c) % 50) for c in text[:4]]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, token_ids))


class FakeRewards:
    """A seeded coin-flip reward (so some groups have zero variance); a scripted share of calls fail."""

    def __init__(self, rng: random.Random, fail_rate: float = 0.0) -> None:
        self.rng = rng
        self.fail_rate = fail_rate

    async def score(self, text: str, sample: TaskSample) -> RewardResult:
        await asyncio.sleep(self.rng.random() * 0.5)
        if self.rng.random() < self.fail_rate:
            return RewardResult(reward=0.0, status=RewardStatus.FAILED, reason="scripted failure")
        return RewardResult(reward=float(self.rng.random() < 0.5), status=RewardStatus.OK)


@dataclass
class FakeTrainer:
    """Records each batch with the trainer version it was trained at; training takes virtual time."""

    ledger: Ledger
    train_s: float
    batches: list[tuple[int, list[Group]]] = field(default_factory=list)

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        for group in groups:
            self.ledger.record_trained(
                group.prompt_uid, start_version=group.start_version, trained_version=policy_version
            )
        self.batches.append((policy_version, list(groups)))
        await asyncio.sleep(self.train_s)
        return {}

    async def state_for_sync(self) -> dict[str, int]:
        return {"step": len(self.batches)}


@dataclass
class Scenario:
    mode: str
    async_ratio: float | None = None
    num_steps: int = 4
    batch: int = 2
    group: int = 2
    num_engines: int = 2
    redundant: int = 0
    filter: str = "none"
    generation: str = "queue"
    reward_fail_rate: float = 0.0
    train_s: float = 5.0
    wait_for_older: bool | None = None


@dataclass
class Outcome:
    ledger: Ledger
    admitted: list[str]
    batches: list[tuple[int, list[Group]]]
    accounting: object
    proxy_stats: dict
    unfinished: list[str]
    """The prompts the source still holds as not ended (a resumed run would hand them out again)."""


def make_test_proxy(mode: str, engines: list[FakeEngine], ratio: float) -> LLMProxy | MultiVersionProxy:
    """The proxy ``mode`` runs on: the multi-version orchestrator, or an LLMProxy with the mode's policy."""
    if mode_spec(mode).multi_version:
        return MultiVersionProxy(engines, async_ratio=ratio)
    return LLMProxy(engines, ProxyConfig(update_policy=mode_spec(mode).update_policy))


async def run_scenario(scenario: Scenario, seed: int) -> Outcome:
    """Run ``scenario`` to the end and return its ledger (every admitted prompt's end) and batches."""
    rng = random.Random(seed)
    ratio = async_ratio_for(scenario.mode, scenario.async_ratio)
    samples = [TaskSample(uid=f"p{i}", prompt=f"q{i}", answer="0") for i in range(50)]
    source = PromptSource(samples, seed=seed)
    engines = [
        FakeEngine(lengths=long_tail_length, step_s=0.1 + 0.1 * i) for i in range(scenario.num_engines)
    ]
    proxy = make_test_proxy(scenario.mode, engines, ratio)
    buffer = SampleBuffer(
        BufferConfig(async_ratio=ratio, get_batch_timeout_s=10_000.0),
        groups_per_batch=scenario.batch,
        group_size=scenario.group,
        max_redundant_groups=scenario.redundant,
    )
    admitted: list[str] = []
    try_acquire = buffer.try_acquire_admission

    def recording_try_acquire(producer: str, key: str = ""):
        """Every ticket passes here: ``acquire_admission`` is built on ``try_acquire_admission``."""
        admission = try_acquire(producer, key)
        if admission is not None:
            admitted.append(admission.key)
        return admission

    buffer.try_acquire_admission = recording_try_acquire  # type: ignore[method-assign]
    rollout = RolloutConfig(
        rollout_batch_size=scenario.batch,
        num_return_sequences=scenario.group,
        max_new_tokens=40,
        filter=scenario.filter,
        max_additional_running_prompts=scenario.redundant,
        generation=scenario.generation,
    )
    ledger = Ledger()
    producer = RLVRProducer(
        source=source,
        proxy=proxy,
        rewards=FakeRewards(rng, scenario.reward_fail_rate),
        buffer=buffer,
        tokenizer=FakeTokenizer(),
        config=rollout,
        seed=seed,
    )
    trainer = FakeTrainer(ledger, scenario.train_s)
    controller = Controller(
        config=ControllerConfig(
            mode=scenario.mode, num_steps=scenario.num_steps, wait_for_older=scenario.wait_for_older
        ),
        buffer=buffer,
        producer=producer,
        source=source,
        trainer=trainer,
        proxy=proxy,
    )
    await controller.run(scenario.num_steps)
    ledger.record_buffer_drops(buffer.take_dropped())
    proxy.close()
    return Outcome(
        ledger=ledger,
        admitted=admitted,
        batches=trainer.batches,
        accounting=buffer.accounting(),
        proxy_stats=proxy.stats(),
        unfinished=source.state_dict()["redo"],
    )
