"""Fault injection on real training runs of the tiny model: an engine killed mid-generation (a Ray actor, by
``ray.kill``; an inline engine, dead), an engine wedged (alive but silent: calls and health probe never
return), a reward raising or hanging. Each run must finish every step with no hang (a deadline fails it
instead), lose no sample, and count the events in ``metrics.jsonl``.

Faults are injected through ``asyncrl.testing.faults`` wrapped around the run's real parts (the engines and
reward the runtime built), at the moment an engine is generating: no sleeping, no timing assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.rewards.service import RewardService
from asyncrl.testing.faults import FaultyEngine, FaultyReward

NUM_STEPS = 3
BATCH, GROUP = 2, 3
RUN_DEADLINE_S = 300.0
"""A run that has not finished by then is hung: the test fails instead of waiting forever."""
COMMON = (
    f"controller.num_steps={NUM_STEPS}",
    "controller.mode=async",
    "controller.eval_prompts=0",
    f"rollout.rollout_batch_size={BATCH}",
    f"rollout.num_return_sequences={GROUP}",
    "rollout.max_new_tokens=24",
    "engine.max_running_requests=8",
    "engine.max_kv_tokens=2048",
    "engine.max_model_len=256",
    "task.num_train=200",
    "task.num_eval=8",
    "trainer.lr=1e-3",
    "reward.name=test_fault_injection:length_reward",
    "reward.timeout_s=2",
    "proxy.health_check_interval_s=1",
    "proxy.health_check_timeout_s=2",
    "model.device=cpu",
)


def length_reward(response_text: str, sample: object) -> float:
    """Longer responses score higher: rewards vary within a group, so no update is zero."""
    return float(len(response_text))


Prepare = Callable[[Any], None]
Inject = Callable[[Any], Awaitable[None]]


def run_with_faults(
    monkeypatch: pytest.MonkeyPatch,
    tiny_path: Path,
    out: Path,
    overrides: tuple[str, ...],
    prepare: Prepare,
    inject: Inject,
    console: io.StringIO | None = None,
) -> list[dict]:
    """Train with ``overrides``; ``prepare(parts)`` wraps the runtime's first parts before the run uses them
    and ``inject(parts)`` runs beside the training loop. Returns the metrics.jsonl step lines."""
    config = load_run_config(None, [*COMMON, f"model.path={tiny_path}", f"output_dir={out}", *overrides])
    built: asyncio.Future[Any] | None = None
    original = training.runtime_parts

    @contextlib.contextmanager
    def faulty_parts(run_config: Any) -> Iterator[Any]:
        with original(run_config) as parts:  # again after a trainer restart: faults strike the first parts
            assert built is not None
            if not built.done():
                prepare(parts)
                built.set_result(parts)
            yield parts

    monkeypatch.setattr(training, "runtime_parts", faulty_parts)

    async def scenario() -> None:
        nonlocal built
        built = asyncio.get_running_loop().create_future()
        async with asyncio.timeout(RUN_DEADLINE_S):
            run = asyncio.ensure_future(training.train(config, console=console))
            injector = asyncio.ensure_future(_after(built, inject))
            await run
            await injector

    asyncio.run(scenario())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "step" in line and "samples" in line]


async def _after(built: asyncio.Future[Any], inject: Inject) -> None:
    await inject(await built)


def wrap_engines(parts: Any) -> None:
    parts.engines[:] = [FaultyEngine(engine, f"engine-{i}") for i, engine in enumerate(parts.engines)]


def assert_nothing_lost(steps: list[dict]) -> None:
    assert [int(step["step"]) for step in steps] == list(range(1, NUM_STEPS + 1))
    assert all(step["samples"] == BATCH * GROUP for step in steps)


@pytest.mark.parametrize("fault", ["kill", "wedge"])
def test_inline_engine_killed_or_wedged_mid_generation_is_replaced(monkeypatch, tiny_path, tmp_path, fault):
    async def inject(parts: Any) -> None:
        (engine,) = parts.engines
        await engine.generating.wait()
        getattr(engine, fault)()

    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, (), wrap_engines, inject)
    assert_nothing_lost(steps)
    last = steps[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0)
    assert last["recovery/reclaimed_requests"] + last["recovery/rerouted_requests"] >= 1
    if fault == "wedge":  # only a probe finds an engine that is alive but silent
        assert last["recovery/failed_probes"] >= 1


@pytest.mark.ray
def test_ray_engine_actor_killed_mid_generation_is_replaced(monkeypatch, tiny_path, tmp_path):
    """Killed after a weight update: its replacement must get that update through the object store, or it
    could not serve (a failed restart leaves no engine and the run fails)."""
    killed: list[Any] = []

    async def inject(parts: Any) -> None:
        (engine,) = parts.engines
        await engine.updated.wait()
        engine.generating.clear()
        await engine.generating.wait()
        killed.append(engine.engine.handle)
        ray.kill(engine.engine.handle, no_restart=True)  # the real actor process dies mid-generation

    overrides = ("runtime.type=local", "runtime.rollout_num_cpus=1", "runtime.train_num_cpus=1")
    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, overrides, wrap_engines, inject)
    assert_nothing_lost(steps)
    last = steps[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0)
    assert last["recovery/rerouted_requests"] >= 1
    assert len(killed) == 1


def test_rewards_raising_and_hanging_fail_only_their_samples(monkeypatch, tiny_path, tmp_path):
    faulty = FaultyReward(length_reward)
    faulty.raise_next(2)
    faulty.hang_next(1)

    def prepare(parts: Any) -> None:
        parts.rewards.close()
        parts.rewards = RewardService(faulty, timeout_s=2.0)

    async def inject(parts: Any) -> None:
        return None

    try:
        steps = run_with_faults(monkeypatch, tiny_path, tmp_path, (), prepare, inject)
    finally:
        faulty.release()
    assert [int(step["step"]) for step in steps] == list(range(1, NUM_STEPS + 1))
    last = steps[-1]
    assert (last["rewards/failed"], last["rewards/timed_out"]) == (2, 1)
    assert last["rewards/scored"] == faulty.num_calls


@pytest.mark.ray
def test_ray_trainer_actor_killed_restarts_the_run_from_its_last_checkpoint(monkeypatch, tiny_path, tmp_path):
    """Killed after the first checkpoint: the run resumes from it (trainer and engines anew) and trains every
    step; the ledger has each sample trained once and metrics.jsonl each step once."""
    saved = asyncio.Event()

    def prepare(parts: Any) -> None:
        save = parts.trainer.save_checkpoint

        def save_and_tell(*args: Any, **kwargs: Any) -> Any:
            path = save(*args, **kwargs)
            saved.set()
            return path

        parts.trainer.save_checkpoint = save_and_tell

    async def inject(parts: Any) -> None:
        await saved.wait()
        ray.kill(parts.trainer.handles[0], no_restart=True)

    overrides = (
        "runtime.type=local",
        "runtime.rollout_num_cpus=1",
        "runtime.train_num_cpus=1",
        "trainer.checkpoint_every=1",
    )
    console = io.StringIO()
    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, overrides, prepare, inject, console)
    assert "trainer lost" in console.getvalue() and "restart 1 from" in console.getvalue()
    assert [int(step["step"]) for step in steps] == list(range(1, NUM_STEPS + 1))
    trained = [
        (line["prompt"], line["sample"])
        for line in map(json.loads, (tmp_path / "ledger.jsonl").read_text().splitlines())
        if line["event"] == "trained"
    ]
    assert len(trained) == len(set(trained)) == NUM_STEPS * BATCH * GROUP
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == NUM_STEPS
