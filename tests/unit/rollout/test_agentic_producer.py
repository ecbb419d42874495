"""The agentic producer under randomized schedules: conservation per episode, freshness, failing and slow
envs replaced, redundant groups and episodes cut and recorded, and the exact multi-turn token layout."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from agentic_helpers import first_group

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.env import EnvConfig, EnvManagerConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.controller import Controller
from asyncrl.envs import CountChainEnv, EnvError, StepResult
from asyncrl.modes import async_ratio_for, mode_spec
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout.agentic_producer import AgenticProducer, make_env_seed_source
from asyncrl.testing import Ledger, Outcome, run_seeds, run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, token_at
from asyncrl.types import Group, Trajectory, TrajectoryStatus

OUTCOME_OF_STATUS = {
    TrajectoryStatus.ABORTED: Outcome.ABORTED,
    TrajectoryStatus.FAILED: Outcome.FAILED,
    TrajectoryStatus.FILTERED: Outcome.FILTERED,
}


class CharTokenizer:
    """One token per character (ids 100 + code % 50), so observation lengths are exact."""

    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [100 + ord(c) % 50 for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, token_ids))


class FlakyEnv:
    """1-3 turns (by seed); each step sleeps a random time, and may hang or crash as scripted."""

    def __init__(self, rng: random.Random, crash_p: float, hang_p: float) -> None:
        self.rng, self.crash_p, self.hang_p = rng, crash_p, hang_p
        self.turns_left = 0

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.turns_left = 1 + seed % 3
        await asyncio.sleep(self.rng.random())
        return "go", {}

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(self.rng.random() * 3)
        if self.rng.random() < self.hang_p:
            await asyncio.sleep(1e6)
        if self.rng.random() < self.crash_p:
            raise EnvError("scripted crash")
        self.turns_left -= 1
        done = self.turns_left == 0
        return StepResult("ok", float(self.rng.random() < 0.5) if done else 0.0, done, False, {})


@dataclass
class Scenario:
    mode: str = "sync"
    async_ratio: float = 0.0
    stepping: str = "async"
    batch: int = 2
    group: int = 2
    num_env_groups: int = 2
    env_group_size: int = 2
    crash_p: float = 0.0
    hang_p: float = 0.0
    num_steps: int = 3
    filter: str = "none"
    episode_replays: int = 0


@dataclass
class Run:
    ledger: Ledger
    started: list[str]
    dropped: list[Trajectory]
    batches: list[list[Group]]
    producer: AgenticProducer
    end_time: float


@dataclass
class LedgerTrainer:
    ledger: Ledger
    batches: list[list[Group]] = field(default_factory=list)

    async def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        for t in (t for g in groups for t in g.trajectories):
            self.ledger.record_trained(t.uid, start_version=t.start_version, trained_version=policy_version)
        self.batches.append(list(groups))
        await asyncio.sleep(2.0)
        return {}

    async def state_for_sync(self) -> dict[str, int]:
        return {}


async def run_scenario(s: Scenario, seed: int) -> Run:
    rng = random.Random(seed)
    ratio = async_ratio_for(s.mode, s.async_ratio)
    engines = [FakeEngine(lengths=lambda rid: 1 + len(rid) % 4, step_s=0.2) for _ in range(2)]
    proxy = LLMProxy(engines, ProxyConfig(update_policy=mode_spec(s.mode).update_policy))
    buffer = SampleBuffer(
        BufferConfig(async_ratio=ratio, get_batch_timeout_s=1e6, admission_timeout_s=1e6),
        groups_per_batch=s.batch,
        group_size=s.group,
        max_redundant_groups=s.num_env_groups - s.batch,
    )
    started: list[str] = []
    try_acquire = buffer.try_acquire_admission

    def recording(producer: str, key: str = ""):
        admission = try_acquire(producer, key)
        if admission is not None:
            started.extend(f"{key}#{i}" for i in range(s.env_group_size))
        return admission

    buffer.try_acquire_admission = recording  # type: ignore[method-assign]
    ledger, dropped = Ledger(), []

    def on_dropped(t: Trajectory) -> None:
        dropped.append(t)
        ledger.record_dropped(t.uid, OUTCOME_OF_STATUS[t.status], t.reason)

    source = make_env_seed_source(20, seed)
    producer = AgenticProducer(
        source=source,
        proxy=proxy,
        buffer=buffer,
        tokenizer=CharTokenizer(),
        rollout=RolloutConfig(
            rollout_batch_size=s.batch, num_return_sequences=s.group, max_new_tokens=4, filter=s.filter
        ),
        config=EnvManagerConfig(
            num_env_groups=s.num_env_groups,
            group_size=s.env_group_size,
            stepping=s.stepping,  # type: ignore[arg-type]
            step_timeout_s=10.0,
            episode_replays=s.episode_replays,
        ),
        make_env=lambda: FlakyEnv(rng, s.crash_p, s.hang_p),
        seed=seed,
        on_dropped=on_dropped,
    )
    trainer = LedgerTrainer(ledger)
    controller = Controller(
        config=ControllerConfig(mode=s.mode, num_steps=s.num_steps),
        buffer=buffer,
        producer=producer,
        source=source,
        trainer=trainer,
        proxy=proxy,
    )
    await controller.run(s.num_steps)
    end_time = asyncio.get_running_loop().time()
    for record in buffer.take_dropped():
        for t in record.group.trajectories if record.group is not None else ():
            ledger.record_dropped(t.uid, Outcome.ABORTED, f"{record.kind.value}: {record.reason}")
    proxy.close()
    return Run(ledger, started, dropped, trainer.batches, producer, end_time)


def check_invariants(s: Scenario, run: Run) -> None:
    run.ledger.assert_complete(run.started)
    run.ledger.assert_fresh(async_ratio_for(s.mode, s.async_ratio))
    assert len(run.batches) == s.num_steps
    for group in (g for batch in run.batches for g in batch):
        assert 1 <= len(group) <= s.group
        assert all(t.status.trainable for t in group.trajectories)
    assert all(t.reason for t in run.dropped)


SCENARIOS = {
    "sync, exact fit": Scenario(),
    "sync, redundant groups and episodes, failing envs": Scenario(
        num_env_groups=3, env_group_size=3, crash_p=0.1, hang_p=0.05
    ),
    "async ratio 1, redundant, failing envs": Scenario(
        mode="async", async_ratio=1.0, num_env_groups=3, env_group_size=3, crash_p=0.1, hang_p=0.05
    ),
    "batch stepping, redundant, failing envs": Scenario(
        stepping="batch", num_env_groups=3, env_group_size=3, crash_p=0.1, hang_p=0.05
    ),
    "one_step_off, batch stepping, filter": Scenario(
        mode="one_step_off", stepping="batch", num_env_groups=3, env_group_size=3, filter="zero_variance"
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_episode_ends_exactly_once_and_fresh_under_shuffled_schedules(name: str) -> None:
    scenario = SCENARIOS[name]

    async def one(seed: int) -> None:
        check_invariants(scenario, await run_scenario(scenario, seed))

    assert run_seeds(one, range(25)) == 25


def test_failing_and_hanging_envs_fail_their_episode_with_a_reason_and_are_replaced() -> None:
    """Over a few schedules (whether a given one hangs an env depends on its interleaving), both kinds of
    failure occur, each with its reason, and every failed episode's env is replaced."""
    scenario = Scenario(num_env_groups=3, env_group_size=3, crash_p=0.2, hang_p=0.1, num_steps=4)
    reasons: set[str] = set()
    for seed in range(6):
        run = run_shuffled(lambda: run_scenario(scenario, seed), seed=seed)  # noqa: B023 (run at once)
        check_invariants(scenario, run)
        failed = [t for t in run.dropped if t.status is TrajectoryStatus.FAILED]
        reasons |= {t.reason for t in failed}
        assert run.producer.num_env_replacements == len(failed)
        assert run.producer.counts["failed"] == len(failed)
    assert reasons == {
        "env failed: EnvError: scripted crash",
        "env call timed out after env_manager.step_timeout_s=10.0s",
    }


def test_failed_episodes_are_replayed_so_that_every_group_trains_full() -> None:
    """episode_replays: a failed episode is played again on its replaced env until the group is full; each
    replay is an episode of its own that ends exactly once. Without replays the same schedules train some
    group short (the guard that the failures happen where a replay is needed)."""
    replaying = Scenario(num_env_groups=3, env_group_size=2, crash_p=0.3, episode_replays=1000, num_steps=4)
    short_groups = 0
    for seed in range(8):
        run = run_shuffled(lambda: run_scenario(replaying, seed), seed=seed)  # noqa: B023 (run at once)
        ended = {e.uid for e in run.ledger.entries()}
        assert set(run.started) <= ended
        assert (
            len(ended) == run.producer.counts["episodes"] > len(run.started)
        )  # some replays, each ended once
        run.ledger.assert_fresh(0.0)
        assert all(len(g) == replaying.group for batch in run.batches for g in batch)
        plain = run_shuffled(
            lambda: run_scenario(dataclasses.replace(replaying, episode_replays=0), seed),  # noqa: B023
            seed=seed,
        )
        check_invariants(replaying, plain)
        short_groups += sum(len(g) < replaying.group for batch in plain.batches for g in batch)
    assert short_groups > 0


def test_redundant_episodes_cover_a_failure_without_a_replay() -> None:
    """A replay starts only when the group's running episodes could not fill it: with no failures none
    starts, and with one spare episode per group a single failure needs none."""
    for crash_p in (0.0, 0.05):
        scenario = Scenario(num_env_groups=2, env_group_size=3, crash_p=crash_p, episode_replays=1000)
        for seed in range(6):
            run = run_shuffled(lambda s=scenario: run_scenario(s, seed), seed=seed)  # noqa: B023
            failed_per_group: dict[str, int] = {}
            for t in run.dropped:
                if t.status is TrajectoryStatus.FAILED:
                    failed_per_group[t.prompt_uid] = failed_per_group.get(t.prompt_uid, 0) + 1
            # each group started 3 episodes for 2: replays <= failures beyond the one spare
            replays = run.producer.counts["episodes"] - len(run.started)
            assert replays <= sum(max(0, n - 1) for n in failed_per_group.values())
            assert all(len(g) == scenario.group for batch in run.batches for g in batch)


def test_episode_replays_need_async_stepping() -> None:
    with pytest.raises(ValueError, match="episode_replays=1 needs env_manager.stepping='async'"):
        EnvManagerConfig(stepping="batch", episode_replays=1)


def test_redundant_groups_and_episodes_are_cut_and_recorded() -> None:
    scenario = Scenario(num_env_groups=4, env_group_size=3, num_steps=3)
    run = run_shuffled(lambda: run_scenario(scenario, 1), seed=1)
    check_invariants(scenario, run)
    reasons = {t.reason.partition(":")[0] for t in run.dropped}
    assert {"redundant", "stale"} <= reasons <= {"redundant", "stale", "producer stopped"}
    aborted = [e for e in run.ledger.entries() if e.outcome is Outcome.ABORTED]
    assert len(aborted) == len(run.started) - sum(len(g) for b in run.batches for g in b)


def test_async_stepping_beats_batch_stepping_with_variable_env_latency() -> None:
    times = {}
    for stepping in ("async", "batch"):
        scenario = Scenario(stepping=stepping, batch=4, num_env_groups=4, num_steps=4)
        times[stepping] = run_shuffled(lambda s=scenario: run_scenario(s, 0), seed=None).end_time
    assert times["async"] < 0.9 * times["batch"]


def test_multi_turn_trajectory_layout_is_exact() -> None:
    """count_chain, 2 turns of 1 number: context = obs0, response0, obs1, response1 with masks 0/1."""
    env_config = EnvConfig(num_turns=2, max_start=5, min_span=1, max_span=1)

    async def scenario() -> Group:
        engine = FakeEngine(lengths=2, step_s=1.0)
        proxy = LLMProxy([engine], ProxyConfig(update_policy="drain"))
        buffer = SampleBuffer(BufferConfig(async_ratio=0.0), groups_per_batch=1, group_size=1)
        producer = AgenticProducer(
            source=make_env_seed_source(1, 0),
            proxy=proxy,
            buffer=buffer,
            tokenizer=CharTokenizer(),
            rollout=RolloutConfig(rollout_batch_size=1, num_return_sequences=1, max_new_tokens=2),
            config=EnvManagerConfig(num_env_groups=1, group_size=1),
            make_env=lambda: CountChainEnv(env_config),
            seed=0,
        )
        return await first_group(producer, buffer, proxy)

    group = run_shuffled(scenario, seed=0)
    (t,) = group.trajectories
    first, second = env_config_prompts(env_config, t.info["env_seed"])
    tok = CharTokenizer()
    response0 = [token_at(f"{t.uid}.0", p) for p in range(2)]
    response1 = [token_at(f"{t.uid}.1", p) for p in range(2)]
    assert t.token_ids == tok.encode(first) + response0 + tok.encode(" " + second) + response1
    assert t.loss_mask == [0] * len(first) + [1, 1] + [0] * (len(second) + 1) + [1, 1]
    assert t.versions == [v if m else -1 for v, m in zip([0] * len(t.loss_mask), t.loss_mask, strict=True)]
    assert t.num_prompt_tokens == len(first)
    assert (t.status, t.reward, t.info["turns"]) == (TrajectoryStatus.COMPLETED, 0.0, 2)
    assert t.response_text == " ".join(map(str, response0)) + " ".join(map(str, response1))


def env_config_prompts(config: EnvConfig, seed: int) -> tuple[str, str]:
    from asyncrl.envs.count_chain import count_prompt, plan_turns

    (a, b), (c, d) = plan_turns(config, seed)
    return count_prompt(a, b), count_prompt(c, d)


class SlowEnv:
    """Every step takes 5 s; one step per episode."""

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return "go", {}

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(5.0)
        return StepResult("", 1.0, True, False, {})


@pytest.mark.parametrize("stepping", ["async", "batch"])
def test_cancelling_the_producer_records_every_running_episode_and_releases_its_group(stepping: str) -> None:
    async def scenario() -> tuple[list[Trajectory], Any]:
        proxy = LLMProxy([FakeEngine(lengths=2, step_s=0.1)], ProxyConfig(update_policy="drain"))
        buffer = SampleBuffer(BufferConfig(async_ratio=0.0), groups_per_batch=2, group_size=2)
        dropped: list[Trajectory] = []
        producer = AgenticProducer(
            source=make_env_seed_source(4, 0),
            proxy=proxy,
            buffer=buffer,
            tokenizer=CharTokenizer(),
            rollout=RolloutConfig(rollout_batch_size=2, num_return_sequences=2, max_new_tokens=2),
            config=EnvManagerConfig(num_env_groups=2, group_size=2, stepping=stepping),  # type: ignore[arg-type]
            make_env=SlowEnv,
            seed=0,
            on_dropped=dropped.append,
        )
        task = asyncio.ensure_future(producer.run())
        await asyncio.sleep(3.0)  # every episode is inside its first env step
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        proxy.close()
        return dropped, buffer.accounting()

    dropped, accounting = run_shuffled(scenario, seed=0)
    assert sorted(t.uid for t in dropped) == sorted(f"{key}#{i}" for key in keys(dropped) for i in range(2))
    assert len(dropped) == 4
    assert {(t.status, t.reason) for t in dropped} == {(TrajectoryStatus.ABORTED, "producer stopped")}
    assert (accounting.num_in_flight, accounting.num_dropped) == (0, {"aborted": 2})


def keys(trajectories: Sequence[Trajectory]) -> set[str]:
    return {t.prompt_uid for t in trajectories}
