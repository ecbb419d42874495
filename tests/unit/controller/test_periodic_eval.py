"""Evaluation during training against the real producer, buffer, proxy and controller on fakes, over shuffled
schedules on virtual time: in async modes rollout keeps going while it runs and it never holds more than its
share of slots; in sync it is a barrier at exactly the version just synced; every due evaluation lands in one
step's line, with the versions that answered it."""

from __future__ import annotations

import asyncio
import random

import pytest
from controller_harness import FakeRewards, FakeTokenizer, FakeTrainer, long_tail_length, make_test_proxy

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig, EvalSetConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.controller import Controller
from asyncrl.controller.evaluation import ScoredAnswer
from asyncrl.controller.periodic_eval import EvalSet, PeriodicEvaluation, answer_metrics
from asyncrl.data.base import TaskSample
from asyncrl.modes import async_ratio_for
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.sim.clock import run_seeds, run_shuffled
from asyncrl.testing.fake_engine import FakeEngine
from asyncrl.testing.ledger import Ledger
from asyncrl.types import FinishReason, Generation

NUM_STEPS = 6
EVERY = 2
MAX_IN_FLIGHT = 2


class Watched:
    """The proxy, watched: eval requests in flight at once, and rollout requests started while any was."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy
        self.eval_in_flight = 0
        self.most_eval_in_flight = 0
        self.rollout_started_during_eval = 0

    async def generate(self, request, observe=None):
        is_eval = request.request_id.startswith("eval@")
        if is_eval:
            self.eval_in_flight += 1
            self.most_eval_in_flight = max(self.most_eval_in_flight, self.eval_in_flight)
        elif self.eval_in_flight:
            self.rollout_started_during_eval += 1
        try:
            return await self.proxy.generate(request)
        finally:
            self.eval_in_flight -= is_eval

    def __getattr__(self, name):
        return getattr(self.proxy, name)


async def run(mode: str, seed: int) -> tuple[list[dict[str, float]], Watched]:
    rng = random.Random(seed)
    ratio = async_ratio_for(mode, 2.0 if mode == "async" else None)
    samples = [TaskSample(uid=f"p{i}", prompt=f"q{i}", answer="0") for i in range(60)]
    engines = [FakeEngine(lengths=long_tail_length, step_s=0.1 + 0.1 * i) for i in range(2)]
    proxy = Watched(make_test_proxy(mode, engines, ratio))
    buffer = SampleBuffer(
        BufferConfig(async_ratio=ratio, get_batch_timeout_s=10_000.0), groups_per_batch=2, group_size=2
    )
    source = PromptSource(samples[:50], seed=seed)
    rewards = FakeRewards(rng)
    producer = RLVRProducer(
        source=source,
        proxy=proxy,
        rewards=rewards,
        buffer=buffer,
        tokenizer=FakeTokenizer(),
        config=RolloutConfig(rollout_batch_size=2, num_return_sequences=2, max_new_tokens=40),
        seed=seed,
    )
    held_out = EvalSet(EvalSetConfig(name="held", samples_per_prompt=2), samples[50:], 40)
    evaluation = PeriodicEvaluation(
        sets=[held_out],
        every=EVERY,
        last_step=NUM_STEPS,
        barrier=mode == "sync",
        max_in_flight=MAX_IN_FLIGHT,
        proxy=proxy,
        tokenizer=FakeTokenizer(),
        rewards=rewards,
        seed=seed,
        rollout=RolloutConfig(),
    )
    lines: list[dict[str, float]] = []
    controller = Controller(
        config=ControllerConfig(mode=mode, num_steps=NUM_STEPS),
        buffer=buffer,
        producer=producer,
        source=source,
        trainer=FakeTrainer(Ledger(), train_s=2.0),
        proxy=proxy,
        on_step=lambda record: lines.append({"step": record.step} | evaluation.take_finished()),
        after_sync=evaluation.after_sync,
    )
    await controller.run(NUM_STEPS)
    await evaluation.close()
    proxy.proxy.close()
    return lines, proxy


def evaluated(lines: list[dict[str, float]]) -> dict[int, dict[str, float]]:
    """Line step → the evaluation it carries (by the step it scored)."""
    return {line["step"]: line for line in lines if "eval/held/step" in line}


def test_async_evaluation_runs_beside_rollout_within_its_share_and_every_due_one_lands() -> None:
    outcomes = []

    async def scenario(seed: int) -> None:
        lines, watched = await run("async", seed)
        carried = evaluated(lines)
        assert sorted(line["eval/held/step"] for line in carried.values()) == [2, 4]  # each once
        for at, line in carried.items():
            scored = line["eval/held/step"]
            assert scored <= at <= NUM_STEPS
            assert (
                scored <= line["eval/held/policy_version_min"] <= line["eval/held/policy_version_max"] <= at
            )
            assert line["eval/held/num_prompts"] == 10
        assert watched.most_eval_in_flight <= MAX_IN_FLIGHT
        outcomes.append((watched.rollout_started_during_eval, max(carried) - min(carried)))

    assert run_seeds(scenario, range(40)) == 40
    assert all(started > 0 for started, _ in outcomes)  # rollout kept going while evaluations ran
    assert any(line_step_gap > 0 for _, line_step_gap in outcomes)  # and steps went on before they landed


def test_sync_evaluation_is_a_barrier_at_exactly_the_version_synced() -> None:
    async def scenario(seed: int) -> None:
        lines, _ = await run("sync", seed)
        carried = evaluated(lines)
        assert sorted(carried) == [2, 4]  # in the line of the step it scored
        for at, line in carried.items():
            assert line["eval/held/step"] == line["eval/held/policy_version_min"] == at
            assert line["eval/held/policy_version_max"] == at

    assert run_seeds(scenario, range(40)) == 40


def test_mean_and_pass_at_k_are_what_they_say() -> None:
    rewards = {0: [1.0, 0.0, 0.0], 1: [0.0, 0.0, 0.0], 2: [1.0, 1.0, 0.5], 3: [0.5, 0.0, 0.0]}
    answers = [ScoredAnswer(p, r, True, 4) for p, rs in rewards.items() for r in rs]
    metrics = answer_metrics(answers, EvalSetConfig(name="m", samples_per_prompt=3))
    assert metrics["mean@3"] == pytest.approx(4.0 / 12)
    assert metrics["pass@3"] == 2 / 4  # prompts 0 and 2 have a full-reward answer
    assert metrics["pass@1"] == 3 / 12  # answers earning the pass reward
    assert metrics["num_prompts"] == 4 and metrics["failed"] == 0
    lenient = answer_metrics(answers, EvalSetConfig(name="m", samples_per_prompt=3, pass_reward=0.5))
    assert lenient["pass@3"] == 3 / 4


def test_an_evaluation_still_due_waits_for_the_previous_one_and_close_cancels() -> None:
    async def main() -> None:
        gate = asyncio.Event()

        class Slow:
            async def generate(self, request, observe=None):
                await gate.wait()
                return Generation(
                    request_id=request.request_id,
                    prompt_token_ids=[],
                    token_ids=[1],
                    logprobs=[0.0],
                    versions=[7],
                    finish_reason=FinishReason.STOP,
                )

        evaluation = PeriodicEvaluation(
            sets=[EvalSet(EvalSetConfig(name="s"), [TaskSample(uid="u", prompt="q", answer="0")], 4)],
            every=1,
            last_step=10,
            barrier=False,
            max_in_flight=1,
            proxy=Slow(),
            tokenizer=FakeTokenizer(),
            rewards=FakeRewards(random.Random(0)),
            seed=0,
            rollout=RolloutConfig(),
        )
        await evaluation.after_sync(1)
        assert evaluation.pending_steps() == [1]
        second = asyncio.ensure_future(evaluation.after_sync(2))
        await asyncio.sleep(1)
        assert not second.done()  # step 2's evaluation waits for step 1's to land first
        gate.set()
        await second
        finished = evaluation.take_finished()
        assert finished["eval/s/step"] == 1 and finished["eval/s/policy_version_min"] == 7
        assert finished["time/eval_wait_s"] >= 1 and evaluation.pending_steps() == [2]
        gate.clear()
        await evaluation.close()
        assert evaluation.pending_steps() == [] and evaluation.take_finished() == {}

    run_shuffled(main, 0)
