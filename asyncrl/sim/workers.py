"""Simulated trainer, rewards and tokenizer behind the seams the real controller and producer call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from asyncrl.config.sim import SimTrainerConfig
from asyncrl.data.base import TaskSample
from asyncrl.metrics.timeline import Timeline
from asyncrl.rewards.service import RewardResult, RewardStatus
from asyncrl.rle import RleSequence
from asyncrl.sim import cost
from asyncrl.sim.workload import PassRates
from asyncrl.types import Group


@dataclass(frozen=True)
class TrainRecord:
    """One simulated training step on the virtual clock."""

    version: int
    start_s: float
    end_s: float
    num_samples: int
    num_tokens: int
    start_versions: tuple[int, ...]
    num_truncated: int
    response_lengths: tuple[int, ...]


@dataclass
class SimTrainer:
    """``TrainerClient`` whose step takes ``cost.train_step_s`` virtual seconds, times the config's
    ``concurrent_slowdown`` when ``engines_busy()`` says an engine generates as it starts; keeps one record
    per step."""

    config: SimTrainerConfig
    num_gpus: int
    timeline: Timeline
    records: list[TrainRecord] = field(default_factory=list)
    engines_busy: Callable[[], bool] = lambda: False

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        samples = [t for g in groups for t in g.trajectories]
        num_tokens = sum(len(t.token_ids) for t in samples)
        start = loop.time()
        slowdown = self.config.concurrent_slowdown if self.engines_busy() else 1.0
        await asyncio.sleep(slowdown * cost.train_step_s(self.config, self.num_gpus, num_tokens))
        self.timeline.add("trainer", start, loop.time(), "train")
        self.records.append(
            TrainRecord(
                version=policy_version,
                start_s=start,
                end_s=loop.time(),
                num_samples=len(samples),
                num_tokens=num_tokens,
                start_versions=tuple(t.start_version for t in samples),
                num_truncated=sum(t.status.value == "truncated" for t in samples),
                response_lengths=tuple(len(t.token_ids) - t.num_prompt_tokens for t in samples),
            )
        )
        return {}

    async def state_for_sync(self) -> dict[str, int]:
        return {"num_steps": len(self.records)}


class SimRewards:
    """The reward service's ``score``: waits ``latency_s``, then a Bernoulli outcome by prompt pass rate.

    The simulated engine puts the request id in ``Generation.text``, which is what arrives here.
    """

    def __init__(self, pass_rates: PassRates, latency_s: float) -> None:
        self.pass_rates = pass_rates
        self.latency_s = latency_s

    async def score(self, text: str, sample: TaskSample) -> RewardResult:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return RewardResult(
            reward=self.pass_rates.reward(text), status=RewardStatus.OK, elapsed_s=self.latency_s
        )


class SimTokenizer:
    """Every prompt is ``prompt_tokens`` tokens; responses decode to nothing (the engine supplies text).

    A prompt is one run (``RleSequence``), as a simulated response is: the proxy checks a list's tokens one by
    one for every request, which at hundreds of tokens per prompt was most of a large simulation's time."""

    chat_template = None

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens

    def encode(self, text: str) -> RleSequence[int]:
        return RleSequence.repeat(1, self.prompt_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return ""
