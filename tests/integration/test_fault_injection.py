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
from ray_actors import until_dead

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.proxy.errors import EnginesLost
from asyncrl.rewards.service import RewardService
from asyncrl.testing.faults import FaultyEngine, FaultyReward

NUM_STEPS = 3
BATCH, GROUP = 2, 3
RUN_DEADLINE_S = 300.0
"""A run that has not finished by then is hung: the test fails instead of waiting forever."""
PATROL_S = 1.0
"""``proxy.health_check_interval_s``."""
HEALTH_TIMEOUT_S = 10.0
"""``proxy.health_check_timeout_s``: a live engine waiting for the CPU on a loaded 2-core box answers within it
(2 s can pass while it waits, and its replacement breaks the exact restart counts); a wedge is found this late."""
REWARD_TIMEOUT_S = 10.0
"""``reward.timeout_s``, for the same reason: only a reward made to hang may time out."""
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
    f"reward.timeout_s={REWARD_TIMEOUT_S}",
    f"proxy.health_check_interval_s={PATROL_S}",
    f"proxy.health_check_timeout_s={HEALTH_TIMEOUT_S}",
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


RAY_TRAINER_RESTARTS = (
    "runtime.type=local",
    "runtime.rollout_num_cpus=1",
    "runtime.train_num_cpus=1",
    "trainer.checkpoint_every=1",
)
"""A Ray run whose trainer may be killed: it restarts from the checkpoint of every step."""


def tell_when_saved(parts: Any, saved: asyncio.Event) -> None:
    """Set ``saved`` after each checkpoint the run's trainer writes."""
    save = parts.trainer.save_checkpoint

    def save_and_tell(*args: Any, **kwargs: Any) -> Any:
        path = save(*args, **kwargs)
        saved.set()
        return path

    parts.trainer.save_checkpoint = save_and_tell


def _until_lost(update: Any) -> None:
    """Return once the buffers of a killed trainer's weight ``update`` are known lost (``ray.kill`` returns
    before the actor is gone, and its death takes a moment to reach the object store)."""
    while True:
        try:
            ray.get(list(update.handle), timeout=30)
        except ray.exceptions.RayError:
            return


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


def test_inline_update_slowed_past_three_patrols_completes_with_no_engine_replaced(
    monkeypatch, tiny_path, tmp_path
):
    """The first weight update takes a probe's timeout and 3.5 patrol intervals longer, the engine answering no
    probe meanwhile (a probe of it would fail): the patrol leaves an updating engine alone, so the run trains
    every step on the one engine it started with."""

    def prepare(parts: Any) -> None:
        wrap_engines(parts)
        parts.engines[0].slow_next_update(HEALTH_TIMEOUT_S + 3.5 * PATROL_S)

    async def inject(parts: Any) -> None:
        await parts.engines[0].updated.wait()

    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, (), prepare, inject)
    assert_nothing_lost(steps)
    last = steps[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_probes"]) == (0, 0)


def test_inline_engine_killed_during_a_weight_update_is_replaced_and_the_run_goes_on(
    monkeypatch, tiny_path, tmp_path
):
    def prepare(parts: Any) -> None:
        wrap_engines(parts)
        parts.engines[0].slow_next_update(60.0)  # the kill lands while the update is still applying

    async def inject(parts: Any) -> None:
        (engine,) = parts.engines
        await engine.updating.wait()
        engine.kill()

    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, (), prepare, inject)
    assert_nothing_lost(steps)
    last = steps[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0)


@pytest.mark.ray
@pytest.mark.slow
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
        parts.rewards = RewardService(faulty, timeout_s=REWARD_TIMEOUT_S)

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
@pytest.mark.slow
def test_ray_trainer_actor_killed_restarts_the_run_from_its_last_checkpoint(monkeypatch, tiny_path, tmp_path):
    """Killed after the first checkpoint: the run resumes from it (trainer and engines anew) and trains every
    step; the ledger has each sample trained once and metrics.jsonl each step once."""
    saved = asyncio.Event()

    def prepare(parts: Any) -> None:
        tell_when_saved(parts, saved)

    async def inject(parts: Any) -> None:
        await saved.wait()
        ray.kill(parts.trainer.handles[0], no_restart=True)

    console = io.StringIO()
    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, RAY_TRAINER_RESTARTS, prepare, inject, console)
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


class HeldUpdates(FaultyEngine):
    """Takes weight updates only once ``released`` is set: an engine still fetching the trainer's weights."""

    def __init__(self, engine: Any, name: str, released: asyncio.Event) -> None:
        super().__init__(engine, name)
        self.released = released

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        await self.released.wait()
        await super().update_weights(named_tensors, version)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_trainer_killed_while_the_engines_fetch_its_weights_restarts_the_run(
    monkeypatch, tiny_path, tmp_path
):
    """The weights an engine fetches die with the trainer that published them: the engine fails its update, its
    replacement cannot catch up, and no engine is left. The run must not wait out its batch timeout (the
    producer dropping group after group meanwhile): the controller sees every engine lost, the trainer is found
    dead, and the run restarts from its last checkpoint."""
    saved, released = asyncio.Event(), asyncio.Event()

    published: list[Any] = []

    def prepare(parts: Any) -> None:
        parts.engines[:] = [HeldUpdates(e, f"engine-{i}", released) for i, e in enumerate(parts.engines)]
        tell_when_saved(parts, saved)
        publish = parts.trainer.state_for_sync
        parts.trainer.state_for_sync = lambda: published.append(publish()) or published[-1]

    async def inject(parts: Any) -> None:
        await saved.wait()  # step 1 trained and checkpointed; its weights are not on the engine yet
        ray.kill(parts.trainer.handles[0], no_restart=True)
        await asyncio.to_thread(_until_lost, published[-1])
        released.set()

    overrides = (
        *RAY_TRAINER_RESTARTS,
        # sync: nothing is buffered ahead, so step 2's batch needs the engines and the trainer is not asked
        # again before they are all lost (async could train step 2 from its buffer and find it dead there)
        "controller.mode=sync",
        "buffer.async_ratio=0",
    )
    console = io.StringIO()
    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, overrides, prepare, inject, console)
    found_by_the_check_after_the_engines_were_lost = "trainer lost (trainer: alive"
    assert found_by_the_check_after_the_engines_were_lost in console.getvalue()
    assert "restart 1 from" in console.getvalue()
    assert [int(step["step"]) for step in steps] == list(range(1, NUM_STEPS + 1))


def test_inline_engines_all_lost_end_the_run_at_once_with_their_errors(monkeypatch, tiny_path, tmp_path):
    """An engine killed with no replacement to be had: the run fails with ``EnginesLost`` naming the failure,
    instead of dropping every prompt as failed until the batch timeout."""

    def prepare(parts: Any) -> None:
        wrap_engines(parts)

        async def no_capacity(index: int, failed: Any) -> Any:
            raise RuntimeError("no capacity to start an engine")

        parts.engine_factory.replace = no_capacity

    async def inject(parts: Any) -> None:
        (engine,) = parts.engines
        await engine.generating.wait()
        engine.kill()

    overrides = ("buffer.get_batch_timeout_s=600",)
    with pytest.raises(EnginesLost, match="engine 0"):
        run_with_faults(monkeypatch, tiny_path, tmp_path, overrides, prepare, inject)


BROADCAST = (
    "runtime.type=local",
    "runtime.rollout_num_cpus=1",
    "runtime.train_num_cpus=1",
    "weight_sync.type=broadcast",
    "weight_sync.timeout_s=20",
)
"""A Ray run whose weights travel by broadcast, with engine recovery on (the default restarts)."""


def assert_trained_once(out: Path) -> None:
    """The ledger: every sample trained exactly once over the whole run, restarts included."""
    trained = [
        (line["prompt"], line["sample"])
        for line in map(json.loads, (out / "ledger.jsonl").read_text().splitlines())
        if line["event"] == "trained"
    ]
    assert len(trained) == len(set(trained)) == NUM_STEPS * BATCH * GROUP


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    [("controller.mode=async",), ("controller.mode=sync", "buffer.async_ratio=0")],
    ids=["staged", "streamed"],
)
def test_ray_engine_dying_mid_broadcast_is_replaced_and_catches_up(monkeypatch, tiny_path, tmp_path, mode):
    """The only engine dies while the second broadcast is under way: rank 0's send fails, the group is formed
    again without it and the send retried; the proxy replaces the engine, which catches up from rank 0's copy
    of the last broadcast and joins the group formed for the next one. Nothing is lost or trained twice. In
    ``async`` the engines stage each broadcast; in ``sync`` they apply it as it arrives (``broadcast_apply``)."""
    killed: list[Any] = []

    def prepare(parts: Any) -> None:
        assert parts.config.broadcast_apply() == ("streamed" if mode[0].endswith("=sync") else "staged")
        group = parts.engine_factory.weight_group
        sends = [0]

        def kill_on_the_second_send() -> None:
            sends[0] += 1
            if sends[0] == 2:
                handle = parts.engines[0].handle
                ray.kill(handle, no_restart=True)
                until_dead(handle.ready.remote)
                killed.append(handle)

        group.before_send = kill_on_the_second_send

    async def inject(parts: Any) -> None:
        return None

    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, (*BROADCAST, *mode), prepare, inject)
    assert_nothing_lost(steps)
    assert_trained_once(tmp_path)
    assert len(killed) == 1
    last = steps[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_trainer_dying_mid_broadcast_restarts_the_run_from_its_checkpoint(
    monkeypatch, tiny_path, tmp_path
):
    """Trainer rank 0 dies while the engines wait for its broadcast: their receive fails by its deadline, the
    publish names the trainer (``TrainerDied``) and the run restarts from its last checkpoint, every sample
    trained exactly once."""

    def prepare(parts: Any) -> None:
        group = parts.engine_factory.weight_group
        sends = [0]

        def kill_the_trainer_on_the_second_send() -> None:
            sends[0] += 1
            if sends[0] == 2:
                ray.kill(parts.trainer.handles[0], no_restart=True)

        group.before_send = kill_the_trainer_on_the_second_send

    async def inject(parts: Any) -> None:
        return None

    console = io.StringIO()
    overrides = (*BROADCAST, "trainer.checkpoint_every=1")
    steps = run_with_faults(monkeypatch, tiny_path, tmp_path, overrides, prepare, inject, console)
    assert "trainer lost" in console.getvalue() and "restart 1 from" in console.getvalue()
    assert [int(step["step"]) for step in steps] == list(range(1, NUM_STEPS + 1))
    assert_trained_once(tmp_path)
