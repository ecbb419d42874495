"""Simulated environments on the timeline: each env's spans have exactly the cost model's lengths, fail-stop
steps show as ``env_fail``, recording them moves no simulated number, and the Gantt chart keeps the trainer
and engines visible when there are more envs than rows."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import replace

import pytest

from asyncrl.app.simulate import simulate
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.env import EnvManagerConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.sim import SimConfig, SimEngineConfig, SimEnvConfig, SimRewardConfig
from asyncrl.metrics.plots import COLORS, left_out_label, plot_timeline, timeline_rows
from asyncrl.metrics.timeline import Timeline, is_env_worker
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.env_cost import ENV_KINDS, SimEnv, step_spans
from asyncrl.sim.result import SimResult
from asyncrl.sim.workload import PassRates

NOMINAL_S = {"env_reset": 0.5, "env_step": 2.0, "reward": 1.0}
"""What the constant-latency cost model of ``CONSTANT`` says each span lasts."""

CONSTANT = SimConfig(
    producer="agentic",
    num_prompts=64,
    prompt_tokens=16,
    engine=SimEngineConfig(decode_step_s=0.02, max_running_requests=32, weight_update_s=1.0),
    rollout=RolloutConfig(num_engines=2, rollout_batch_size=4, num_return_sequences=2, max_new_tokens=16),
    env=SimEnvConfig(
        latency="constant", mean_s=2.0, reward_latency_s=1.0, reset_s=0.5, num_turns=3, observation_tokens=4
    ),
    env_manager=EnvManagerConfig(num_env_groups=6, group_size=2, max_context_tokens=512),
    controller=ControllerConfig(num_steps=3),
)

FAIL_STOP = replace(CONSTANT, env=replace(CONSTANT.env, fail_stop_p=0.1))

TOTALS_BEFORE_ENV_SPANS = {
    "sim_time_s": 41.40070000000001,
    "mean_step_s": 13.800233333333336,
    "mean_wait_s": 8.793333333333335,
    "mean_train_s": 5.006900000000002,
    "engine_busy_fraction": 0.1178724031236187,
    "trainer_busy_fraction": 0.3628127060653564,
    "generated_tokens": 1664.0,
    "requests": 104.0,
    "trained_tokens": 1656.0,
    "trained_samples": 23.0,
    "dropped_env_replaced": 4.0,
    "dropped_episodes_failed": 4.0,
    "dropped_episodes_aborted": 12.0,
}
"""``simulate(FAIL_STOP).totals`` recorded with ``timeline="none"`` (spans must not move them). Re-recorded when
redundant env groups began to be cut the moment their batch is full (before: at the weight sync after
training, and sync admission let more untrainable groups start meanwhile: 127 requests then, 104 now)."""


def env_spans(result: SimResult) -> dict[str, list[list]]:
    return {worker: spans for worker, spans in result.spans.items() if is_env_worker(worker)}


def test_step_spans_split_latency_and_reward_and_a_failure_is_one_span() -> None:
    assert step_spans(2.0, 0.0, fails=False) == [(2.0, "env_step"), (0.0, "reward")]
    assert step_spans(2.0, 1.0, fails=False) == [(2.0, "env_step"), (1.0, "reward")]
    assert step_spans(2.0, 1.0, fails=True) == [(3.0, "env_fail")]


def test_an_env_records_its_episode_on_the_timeline_exactly() -> None:
    timeline = Timeline()
    config = SimEnvConfig(mean_s=2.0, reset_s=1.0, reward_latency_s=5.0, num_turns=2)

    async def episode() -> None:
        env = SimEnv(
            config, 1, PassRates(SimRewardConfig(), 0), random.Random(0), name="env7", timeline=timeline
        )
        await env.reset(3)
        await env.step("a")
        await asyncio.sleep(0.5)  # the model generating
        await env.step("b")

    run_shuffled(episode, seed=0)
    assert timeline.spans["env7"] == [
        [0.0, 1.0, "env_reset"],
        [1.0, 3.0, "env_step"],
        [3.5, 5.5, "env_step"],
        [5.5, 10.5, "reward"],
    ]
    assert timeline.busy_s["env7"] == 10.0


def test_a_cancelled_step_records_the_time_it_held_the_env() -> None:
    timeline = Timeline()
    config = SimEnvConfig(mean_s=2.0, reward_latency_s=5.0, num_turns=1)

    async def cut_episode() -> None:
        env = SimEnv(config, 1, PassRates(SimRewardConfig(), 0), random.Random(0), timeline=timeline)
        await env.reset(3)
        step = asyncio.ensure_future(env.step("a"))
        await asyncio.sleep(3.0)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step

    run_shuffled(cut_episode, seed=0)
    assert timeline.spans["env0"] == [[0.0, 2.0, "env_step"], [2.0, 3.0, "reward"]]


def test_constant_latency_env_spans_have_the_cost_models_lengths() -> None:
    result = simulate(CONSTANT)
    spans = env_spans(result)
    assert sorted(spans, key=lambda w: int(w[3:])) == [
        f"env{i}" for i in range(12)
    ]  # 6 groups x 2, none fail
    step_ends = {step.end_s for step in result.steps}
    lengths = Counter()
    for start, end, kind in (span for worker in spans.values() for span in worker):
        if end - start == pytest.approx(NOMINAL_S[kind], abs=1e-9):
            lengths[kind, NOMINAL_S[kind]] += 1
        else:  # only an episode cut when a step ends (surplus groups, the run's end) is shorter
            assert end in step_ends and end - start < NOMINAL_S[kind]
            lengths[kind, "cut"] += 1
    assert lengths == {  # the redundant groups are cut when their batch is full, before a step of theirs
        ("env_reset", 0.5): 36,
        ("env_step", 2.0): 108,
        ("reward", 1.0): 36,
    }
    first_episode = [[round(start, 9), round(end, 9), kind] for start, end, kind in spans["env0"][:5]]
    assert first_episode == [  # 0.32 s between steps: the engine generating
        [0.0, 0.5, "env_reset"],
        [0.82, 2.82, "env_step"],
        [3.14, 5.14, "env_step"],
        [5.46, 7.46, "env_step"],
        [7.46, 8.46, "reward"],
    ]


def test_a_fail_stop_env_shows_env_fail_as_its_last_span_and_is_replaced_by_a_new_worker() -> None:
    result = simulate(FAIL_STOP)
    spans = env_spans(result)
    failed = [
        worker for worker, worker_spans in spans.items() if any(k == "env_fail" for *_, k in worker_spans)
    ]
    assert len(failed) == result.totals["dropped_env_replaced"] == 4
    assert all(spans[worker][-1][2] == "env_fail" for worker in failed)
    fail_lengths = Counter(
        round(e - s, 9) for worker in failed for s, e, k in spans[worker] if k == "env_fail"
    )
    assert fail_lengths == {2.0: 2, 3.0: 2}  # a failing last step also pays the reward latency
    created = {f"env{i}" for i in range(12 + 4)}  # the 12 first envs and their 4 replacements
    assert {f"env{i}" for i in range(12)} <= set(spans) <= created


def test_env_spans_move_no_simulated_total() -> None:
    for timeline in ("full", "none"):
        totals = simulate(replace(FAIL_STOP, timeline=timeline)).totals
        # to the last bits only: the order clock times are summed in may move with the proxy's bookkeeping
        assert {key: totals[key] for key in TOTALS_BEFORE_ENV_SPANS} == pytest.approx(
            TOTALS_BEFORE_ENV_SPANS, rel=1e-12
        )


def test_timeline_rows_keep_trainer_and_engines_first_in_creation_order() -> None:
    workers = ["env10", "engine1", "env2", "trainer", "engine0", "env1"]
    assert timeline_rows(workers) == (
        ["trainer", "engine0", "engine1", "env1", "env2", "env10"],
        {"engines": 0, "envs": 0},
    )
    assert timeline_rows(iter(["env0", "engine0"])) == (
        ["trainer", "engine0", "env0"],
        {"engines": 0, "envs": 0},
    )


def test_timeline_rows_leave_out_envs_beyond_the_budget() -> None:
    engines = [f"engine{i}" for i in range(8)]
    envs = [f"env{i}" for i in range(500)]
    rows, left_out = timeline_rows(["trainer", *engines, *envs], max_rows=48)
    assert rows == ["trainer", *engines, *envs[:39]]
    assert left_out == {"engines": 0, "envs": 461}
    assert left_out_label(left_out) == "not shown: 461 envs"


def test_timeline_rows_share_the_budget_when_engines_alone_would_fill_it() -> None:
    engines = [f"engine{i}" for i in range(100)]
    envs = [f"env{i}" for i in range(500)]
    rows, left_out = timeline_rows(["trainer", *engines, *envs], max_rows=48)
    assert rows == ["trainer", *engines[:36], *envs[:11]]  # a quarter of the 47 rows after the trainer
    assert left_out_label(left_out) == "not shown: 64 engines, 489 envs"
    rows, left_out = timeline_rows(engines, max_rows=48)
    assert rows == ["trainer", *engines[:47]] and left_out == {"engines": 53, "envs": 0}
    assert left_out_label({"engines": 0, "envs": 0}) == ""


def test_plot_timeline_writes_an_agentic_chart_with_more_envs_than_rows(tmp_path) -> None:
    many_envs = replace(
        FAIL_STOP, env_manager=replace(FAIL_STOP.env_manager, num_env_groups=30), num_prompts=128
    )
    result = simulate(replace(many_envs, controller=ControllerConfig(num_steps=1)))
    num_envs = len(env_spans(result))
    assert num_envs >= 60  # 30 groups x 2, and replacements of failed envs
    rows, left_out = timeline_rows(result.spans)
    assert rows[:3] == ["trainer", "engine0", "engine1"] and len(rows) == 48
    assert left_out == {"engines": 0, "envs": num_envs - 45}
    kinds = {kind for spans in env_spans(result).values() for *_, kind in spans}
    assert kinds == set(ENV_KINDS) and kinds <= set(COLORS)  # every env kind is drawn, in its own colour
    path = plot_timeline(result.spans, [s.end_s for s in result.steps], tmp_path / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
