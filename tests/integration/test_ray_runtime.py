"""The Ray runtime on this machine: engine and trainer actors, weight sync through the object store, failures.

Actor processes take seconds to start (torch and transformers imports), so one Ray session (2 CPUs) and one
``build_ray_parts`` (an engine on 1 CPU, the trainer on 1 CPU) serve the whole module. Each test pushes the
weights it needs, so the order of the tests does not matter, except that the kill test comes last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import pytest
import ray
import torch

from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.engine import EngineConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import RuntimeConfig, SwitchConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.engine import make_engine
from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import load_model_and_tokenizer, save_tiny
from asyncrl.models.tiny import build_tiny
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.runtime.actor_calls import ActorCallError, ActorCallTimeout
from asyncrl.runtime.colocate import ColocatedTrainer
from asyncrl.runtime.placement import Placement
from asyncrl.runtime.ray_runtime import (
    RayEngineClient,
    RemoteRequestState,
    build_ray_parts,
    ray_session,
    spawn_engine,
    wait_ready,
)
from asyncrl.trainer.logprobs import compute_token_logprobs
from asyncrl.types import FinishReason, Generation, Group, Request, SamplingParams, Trajectory
from asyncrl.weight_sync import FlatBufferSync, WeightSyncError

pytestmark = pytest.mark.ray

RUNTIME = RuntimeConfig(type="local", rollout_num_cpus=1, train_num_cpus=1, control_timeout_s=60)
ENGINE = EngineConfig(max_running_requests=8, max_kv_tokens=4096)
PROMPTS = [[5, 17, 42], [7, 7, 9, 100, 3], [250, 1, 64]]


@pytest.fixture(scope="module")
def session():
    with ray_session(RUNTIME) as live:
        yield live


@pytest.fixture(scope="module")
def model_config(tmp_path_factory) -> ModelConfig:
    model, tokenizer = build_tiny(
        sample_texts(200), vocab_size=300, hidden_size=64, num_heads=2, num_layers=2
    )
    path = save_tiny(model, tokenizer, tmp_path_factory.mktemp("ray-tiny"))
    return ModelConfig(path=str(path), device="cpu")


@pytest.fixture(scope="module")
def parts(session, model_config):
    built = build_ray_parts(run_config(model_config), RUNTIME)
    yield built
    built.close()


@pytest.fixture(scope="module")
def engine(parts) -> RayEngineClient:
    return parts.engines[0]


@pytest.fixture(scope="module")
def second_engine(parts, model_config):
    """A second engine actor for migrations; it reserves no CPU (the module's two are taken)."""
    extra = spawn_engine(
        model_config, ENGINE, RUNTIME, name="engine-1", num_threads=1, options={"num_cpus": 0}
    )
    wait_ready([extra], RUNTIME.startup_timeout_s)
    yield extra
    extra.shutdown()


def push(engine: RayEngineClient, state: dict[str, torch.Tensor]) -> int:
    """Give ``engine`` these weights through the object store at its next version; return that version."""
    version = engine.stats()["version"] + 1
    asyncio.run(engine.update_weights(FlatBufferSync(put=ray.put).publish(version, state), version))
    return version


def greedy(index: int, max_new_tokens: int = 12) -> Request:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    return Request(request_id=f"r{index}", prompt_token_ids=PROMPTS[index], sampling=sampling)


async def generate_all(engine, requests):
    return await asyncio.gather(*(engine.generate(request) for request in requests))


def in_process_generations(model_config, requests, state=None):
    model, tokenizer = load_model_and_tokenizer(model_config.path, "float32", "cpu")
    if state is not None:
        model.load_state_dict(state, strict=False)
    local = make_engine(model, tokenizer, ENGINE)
    try:
        return asyncio.run(generate_all(local, requests))
    finally:
        local.shutdown()


def base_state(model_config, noise: float = 0.0, seed: int = 0) -> dict[str, torch.Tensor]:
    """The saved model's weights, plus seeded Gaussian noise; tied: one matrix under both names."""
    model, _ = load_model_and_tokenizer(model_config.path, "float32", "cpu")
    gen = torch.Generator().manual_seed(seed)
    state = {name: t + noise * torch.randn(t.shape, generator=gen) for name, t in model.state_dict().items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def test_engine_actor_generates_exactly_what_an_in_process_engine_does(engine, model_config):
    version = push(engine, base_state(model_config))
    requests = [greedy(i) for i in range(len(PROMPTS))]
    remote = asyncio.run(generate_all(engine, requests))
    local = in_process_generations(model_config, requests)
    for got, want in zip(remote, local, strict=True):
        assert got.token_ids == want.token_ids
        assert got.versions == [version] * 12
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_weight_update_through_the_object_store_changes_outputs_and_versions(engine, model_config):
    requests = [greedy(i) for i in range(len(PROMPTS))]
    push(engine, base_state(model_config))
    before = asyncio.run(generate_all(engine, requests))
    state = base_state(model_config, noise=0.5)
    version = push(engine, state)
    after = asyncio.run(generate_all(engine, requests))
    expected = in_process_generations(model_config, requests, state)
    assert [g.token_ids for g in after] == [g.token_ids for g in expected]
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert all(g.versions == [version] * 12 for g in after)

    update = FlatBufferSync(put=ray.put).publish(version + 1, state)
    with pytest.raises(ValueError, match=f"the update is version {version + 1}, the call says {version + 2}"):
        asyncio.run(engine.update_weights(update, version + 2))
    older = FlatBufferSync(put=ray.put).publish(version - 1, state)
    with pytest.raises(WeightSyncError, match=f"v{version - 1} is older than the served v{version}; refused"):
        asyncio.run(engine.update_weights(older, version - 1))
    wrong = FlatBufferSync(put=ray.put).publish(version + 1, {**state, "lm_head.weight": torch.zeros(3, 2)})
    with pytest.raises(WeightSyncError, match="tensor 'lm_head.weight' has shape"):
        asyncio.run(engine.update_weights(wrong, version + 1))
    assert engine.stats()["version"] == version  # refused before anything was copied
    asyncio.run(engine.update_weights(base_state(model_config, 0.5, seed=1), version + 3))  # plain tensors
    assert engine.stats()["version"] == version + 3


def test_a_call_on_a_stuck_engine_times_out_naming_it_and_aborts_there(engine):
    impatient = RayEngineClient(
        engine.handle, "engine-0", dataclasses.replace(RUNTIME, generate_timeout_s=0.5)
    )
    asyncio.run(engine.pause())
    try:
        with pytest.raises(
            ActorCallTimeout, match=r"engine engine-0: generate\(r0\): no answer within 0.5 s"
        ):
            asyncio.run(impatient.generate(greedy(0)))
        deadline = time.monotonic() + 10
        while engine.stats()["waiting"] + engine.stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.stats()["waiting"] + engine.stats()["running"] == 0
    finally:
        asyncio.run(engine.resume())


def run_config(model_config: ModelConfig) -> RunConfig:
    return RunConfig(
        model=model_config,
        engine=ENGINE,
        rollout=RolloutConfig(num_engines=1),
        controller=ControllerConfig(mode="async"),
        buffer=BufferConfig(async_ratio=1),  # at α = 0 an async run is placed as sync
        trainer=TrainerConfig(lr=1e-2),
    )


def groups_from(generations, rewards, version: int) -> list[Group]:
    trajectories = [
        Trajectory(
            prompt_uid="p",
            sample_index=i,
            token_ids=g.prompt_token_ids + g.token_ids,
            loss_mask=[0] * len(g.prompt_token_ids) + [1] * g.num_tokens,
            logprobs=[0.0] * len(g.prompt_token_ids) + g.logprobs,
            versions=[-1] * len(g.prompt_token_ids) + g.versions,
            start_version=version,
            num_prompt_tokens=len(g.prompt_token_ids),
            reward=reward,
        )
        for i, (g, reward) in enumerate(zip(generations, rewards, strict=True))
    ]
    return [Group(prompt_uid="p", trajectories=trajectories)]


def trainer_logprobs(state, model_config, generation) -> list[float]:
    model, _ = load_model_and_tokenizer(model_config.path, "float32", "cpu")
    model.load_state_dict(state)
    ids = torch.tensor([generation.prompt_token_ids + generation.token_ids])
    mask = torch.ones_like(ids)
    loss_mask = mask.clone().float()
    loss_mask[0, : len(generation.prompt_token_ids)] = 0
    with torch.no_grad():
        logprobs = compute_token_logprobs(model, ids, mask, loss_mask, chunk_size=64).logprobs
    return logprobs[0, len(generation.prompt_token_ids) :].tolist()


def sampled(num: int) -> list[Request]:
    return [
        Request(
            request_id=f"s{i}", prompt_token_ids=PROMPTS[0], sampling=SamplingParams(max_new_tokens=8, seed=i)
        )
        for i in range(num)
    ]


def test_trainer_step_then_sync_through_the_proxy_makes_engine_and_trainer_agree(
    parts, model_config, tmp_path
):
    start = parts.trainer.version
    initial = received(parts.trainer.state_for_sync())
    # A fresh engine at the trainer's version: the module's engines were pushed ahead by earlier tests, and an
    # engine refuses weights older than the version it serves.
    fresh = spawn_engine(
        model_config, ENGINE, RUNTIME, name="engine-sync", num_threads=1, options={"num_cpus": 0}
    )
    wait_ready([fresh], RUNTIME.startup_timeout_s)

    async def rollout_train_sync() -> tuple[Generation, dict[str, float]]:
        proxy = LLMProxy([fresh], ProxyConfig(), initial_version=start)
        generations = await asyncio.gather(*(proxy.generate(r) for r in sampled(4)))
        groups = groups_from(generations, [1.0, 0.0, 0.0, 1.0], start)
        metrics = await asyncio.to_thread(parts.trainer.train_step, groups, start)
        await proxy.model_update(parts.trainer.state_for_sync(), start + 1)
        await proxy.update_applied(start + 1, timeout_s=60)
        generation = await proxy.generate(greedy(1))
        proxy.close()
        return generation, metrics

    try:
        generation, metrics = asyncio.run(rollout_train_sync())
    finally:
        fresh.shutdown()
    assert (parts.trainer.version, metrics["version"]) == (start + 1, start + 1.0)
    update = parts.trainer.state_for_sync()
    assert update.version == start + 1
    trained = received(update)
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(trained[name], initial[name])
    assert torch.equal(trained["lm_head.weight"], trained["model.embed_tokens.weight"])
    assert generation.versions == [start + 1] * 12
    assert generation.logprobs == pytest.approx(trainer_logprobs(trained, model_config, generation), abs=1e-4)


def test_the_switch_sleeps_and_wakes_the_engine_actor_and_moves_the_rank_state(parts):
    """The default suite's twin of ``test_ray_colocated_switch`` (slow: whole runs on a shared bundle): the
    switch over this module's actors, two steps. Before the checkpoint round trip: on CPU a loaded checkpoint's
    Adam moments are ``torch.load``'s storages, which cannot be resized, so the offloader leaves them where they
    are (host memory already, ``trainer.offload``) and would move nothing."""
    engine = parts.engines[0]
    switched = ColocatedTrainer(
        parts.trainer, parts.engines, SwitchConfig(enabled=True), timeout_s=60, state=parts.trainer
    )
    pool, slept = engine.stats()["kv_pool_bytes"], engine.stats()["num_sleeps"]
    steps = []
    for _ in range(2):
        version = parts.trainer.version
        generation = asyncio.run(engine.generate(sampled(1)[0]))
        steps.append(switched.train_step(groups_from([generation, generation], [1.0, 0.0], version), version))
        assert engine.stats()["asleep"] == 1  # still asleep after the step, until the weights are published
        switched.state_for_sync()
        assert engine.stats()["asleep"] == 0 and engine.stats()["kv_pool_bytes"] == pool
    for step, metrics in enumerate(steps, start=1):
        assert metrics["colocate/sleep_bytes"] == metrics["colocate/wake_bytes"] == pool > 0, metrics
        assert metrics["colocate/kv_pool_bytes_while_training"] == 0, metrics
        assert metrics["colocate/engine_num_sleeps"] == slept + step, metrics
        assert metrics["colocate/offload_bytes"] > 0, metrics  # Adam's moments, once the first step made them
    assert steps[1]["colocate/reload_bytes"] == steps[0]["colocate/offload_bytes"]
    parts.trainer.reload_state()  # the module's trainer as it was: its state where it lives


def test_trainer_checkpoint_round_trip_through_the_actor(parts, tmp_path):
    step, version = parts.trainer.step, parts.trainer.version
    saved = received(parts.trainer.state_for_sync())
    path = parts.trainer.save_checkpoint(tmp_path / "ckpt", extra={"consumed": 4})
    assert path == tmp_path / "ckpt" / f"step_{step:08d}" and path.is_dir()
    generation = asyncio.run(parts.engines[0].generate(sampled(1)[0]))
    parts.trainer.train_step(groups_from([generation, generation], [1.0, 0.0], version), version)
    assert (parts.trainer.step, parts.trainer.version) == (step + 1, version + 1)
    assert parts.trainer.load_checkpoint(path) == {"consumed": 4}
    assert (parts.trainer.step, parts.trainer.version) == (step, version)
    restored = received(parts.trainer.state_for_sync())
    assert all(torch.equal(restored[name], tensor) for name, tensor in saved.items())


def test_actors_are_separate_processes_threaded_as_placed(parts):
    assert parts.placement == Placement(
        colocated=False,
        engine_num_cpus=1.0,
        engine_threads=1,
        trainer_num_cpus=1.0,
        trainer_threads=1,
    )
    (engine,) = wait_ready(parts.engines, RUNTIME.startup_timeout_s)
    trainer = ray.get(parts.trainer.handles[0].progress.remote())
    assert len({engine["pid"], trainer["pid"], os.getpid()}) == 3
    assert engine["num_threads"] == trainer["num_threads"] == 1


def test_a_second_session_in_the_same_process_reuses_ray_and_leaves_it_running(session):
    with ray_session(RUNTIME) as inner:
        assert not inner.owns_ray
    assert ray.is_initialized()


def received(update) -> dict[str, torch.Tensor]:
    """The tensors of a published update, read back from the object store bucket by bucket."""
    return {name: tensor.clone() for name, tensor in FlatBufferSync(get=ray.get).receive(update)}


def push_both(engines: list[RayEngineClient], state: dict[str, torch.Tensor]) -> int:
    """Give every engine these weights at one common version (above each one's), through one stored object."""
    version = max(e.stats()["version"] for e in engines) + 1
    published = FlatBufferSync(put=ray.put).publish(version, state)

    async def update() -> None:
        await asyncio.gather(*(e.update_weights(published, version) for e in engines))

    asyncio.run(update())
    return version


def long_greedy(index: int) -> Request:
    sampling = SamplingParams(max_new_tokens=1000, temperature=0.0, ignore_eos=True)
    return Request(request_id=f"long{index}", prompt_token_ids=PROMPTS[index], sampling=sampling)


async def wait_running(engines: list[RayEngineClient], count: int) -> None:
    """Until ``count`` requests run across ``engines`` (each has been prefilled and is decoding)."""
    async with asyncio.timeout(30):
        while sum(e.stats()["running"] for e in engines) < count:
            await asyncio.sleep(0.01)


def test_a_request_moves_between_engine_actors_with_its_kv_and_continues_exactly(
    engine, second_engine, model_config
):
    state = base_state(model_config, noise=0.3, seed=2)
    version = push_both([engine, second_engine], state)
    (expected,) = in_process_generations(model_config, [long_greedy(0)], state)

    async def move() -> tuple[Generation, RemoteRequestState, Generation]:
        call = asyncio.create_task(engine.generate(long_greedy(0)))
        await wait_running([engine], 1)
        exported = await engine.export_request("long0")
        return await call, exported, await second_engine.import_request(exported)

    partial, exported, finished = asyncio.run(move())
    assert partial.finish_reason is FinishReason.ABORT and 0 < partial.num_tokens < 1000
    assert (exported.request_id, exported.version) == ("long0", version) and exported.kv_bytes > 0
    assert finished.token_ids == expected.token_ids
    assert finished.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert finished.versions == [version] * 1000
    assert asyncio.run(engine.export_request("long0")) is None


def test_multi_version_on_engine_actors_migrates_a_request_on_update(engine, second_engine, model_config):
    """Two requests on v, one per engine; at v+1 one engine goes to v+1 and its request moves to the other."""
    state = base_state(model_config, noise=0.3, seed=3)
    version = push_both([engine, second_engine], state)
    requests = [long_greedy(0), long_greedy(1)]
    expected = in_process_generations(model_config, requests, state)

    async def scenario() -> tuple[list[Generation], dict]:
        proxy = MultiVersionProxy([engine, second_engine], async_ratio=1.0, initial_version=version)
        calls = [asyncio.create_task(proxy.generate(request)) for request in requests]
        await wait_running([engine, second_engine], 2)
        await proxy.suspend()
        await proxy.model_update(base_state(model_config, noise=0.3, seed=4), version + 1)
        await proxy.resume()
        generations = await asyncio.gather(*calls)
        await proxy.update_applied(version + 1, timeout_s=60)
        stats = proxy.stats()
        proxy.close()
        return generations, stats

    generations, stats = asyncio.run(scenario())
    # one switch at the update (its request moved), one once the old version's work is done
    assert (stats["num_migrations"], stats["num_switches"]) == (1, 2) and stats["kv_bytes_moved"] > 0
    for got, want in zip(generations, expected, strict=True):
        assert got.token_ids == want.token_ids
        assert got.versions == [version] * 1000


def test_killing_an_engine_actor_mid_request_fails_the_request_naming_the_engine(engine):
    """Last in the module: it ends the module's engine actor."""

    async def scenario() -> None:
        long = Request(
            request_id="r-long",
            prompt_token_ids=PROMPTS[0],
            sampling=SamplingParams(max_new_tokens=2000, ignore_eos=True),
        )
        call = asyncio.create_task(engine.generate(long))
        await asyncio.sleep(0.5)
        engine.shutdown()
        async with asyncio.timeout(30):
            with pytest.raises(ActorCallError, match=r"engine engine-0: generate\(r-long\)"):
                await call
        with pytest.raises(ActorCallError, match="engine engine-0: pause"):
            await engine.pause()

    asyncio.run(scenario())


def test_killing_the_trainer_actor_fails_its_next_call_naming_it(parts):
    """Last in the module too: it ends the module's trainer actor."""
    parts.trainer.shutdown()
    with pytest.raises(ActorCallError, match=r"trainer: train_step\(v"):
        parts.trainer.train_step([], parts.trainer.version)
