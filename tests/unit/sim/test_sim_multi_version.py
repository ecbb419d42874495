"""SimEngine export/import on the virtual clock (exact times, no re-prefill with KV), and a whole simulated
run in ``multi_version`` mode behind the real ``MultiVersionProxy``."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.app.simulate import simulate
from asyncrl.config.loader import from_dict
from asyncrl.config.sim import SimConfig, SimEngineConfig
from asyncrl.sim import workers
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.engine import SimEngine, SimRequestState
from asyncrl.types import FinishReason, Generation, Request, SamplingParams

CONFIG = SimEngineConfig(
    decode_step_s=1.0,
    knee_batch=4,
    max_running_requests=2,
    prefill_s_per_token=0.5,
    kv_bytes_per_token=100,
    kv_transfer_s_per_token=0.2,
)
LENGTHS = {"a": 6, "x": 4, "y": 20}


def request(request_id: str) -> Request:
    return Request(
        request_id=request_id, prompt_token_ids=[1, 1], sampling=SamplingParams(max_new_tokens=100)
    )


def engine(name: str, config: SimEngineConfig = CONFIG, version: int = 0) -> SimEngine:
    return SimEngine(config, LENGTHS.__getitem__, name=name, version=version)


async def export_after_three_steps(
    donor: SimEngine,
) -> tuple[asyncio.Future[Generation], SimRequestState, float]:
    """``a`` on ``donor``: prefill 2 tokens (1 s), steps end at t=2, 3, 4; exported mid-step 3, at its end."""
    partial = asyncio.ensure_future(donor.generate(request("a")))
    await asyncio.sleep(3.5)
    state = await donor.export_request("a")
    assert state is not None
    return partial, state, asyncio.get_running_loop().time()


def test_export_then_import_continues_with_its_kv_and_pays_only_the_transfer():
    async def scenario():
        loop = asyncio.get_running_loop()
        donor, receiver = engine("A"), engine("B")
        partial, state, exported_at = await export_after_three_steps(donor)
        generation = await receiver.import_request(state)
        return await partial, state, exported_at, generation, loop.time(), donor.stats(), receiver.stats()

    partial, state, exported_at, generation, done_at, donor, receiver = run_shuffled(scenario, seed=None)
    assert exported_at == 4.0
    assert partial.finish_reason is FinishReason.ABORT and partial.num_tokens == 3
    assert (state.produced, state.version_runs, state.target, state.version) == (3, ((0, 3),), 6, 0)
    assert (state.request_id, state.kv_tokens, state.kv_bytes) == ("a", 5, 500)
    # transfer 5 tokens x 0.2 s = 1 s, joins at t=5 with no prefill (it would cost 2.5 s), 3 more steps
    assert done_at == 8.0
    assert generation.finish_reason is FinishReason.STOP and generation.num_tokens == 6
    assert generation.versions == [0] * 6
    assert (donor["exported"], donor["aborted"], donor["running"]) == (1, 0, 0)
    assert (receiver["imported"], receiver["requests"], receiver["tokens"]) == (1, 0, 3)


def test_abort_while_the_kv_is_on_its_way_ends_the_import_with_the_output_so_far():
    async def scenario():
        loop = asyncio.get_running_loop()
        receiver = engine("B")
        _, state, _ = await export_after_three_steps(engine("A"))
        imported = asyncio.ensure_future(receiver.import_request(state))
        await asyncio.sleep(0.5)  # the transfer takes 1 s
        aborted = await receiver.abort("a")
        return aborted, await imported, loop.time(), receiver.stats(), receiver.kv_reserved

    aborted, imported, now, stats, kv_reserved = run_shuffled(scenario, seed=None)
    assert now == 4.5
    assert aborted.finish_reason is imported.finish_reason is FinishReason.ABORT
    assert aborted.num_tokens == imported.num_tokens == 3
    assert (stats["aborted"], stats["running"], stats["tokens"], kv_reserved) == (1, 0, 0, 0)


def test_export_while_the_kv_is_on_its_way_passes_the_same_state_on():
    async def scenario():
        receiver = engine("B")
        _, state, _ = await export_after_three_steps(engine("A"))
        imported = asyncio.ensure_future(receiver.import_request(state))
        await asyncio.sleep(0.5)
        return state, await receiver.export_request("a"), await imported, receiver.stats()

    state, again, imported, stats = run_shuffled(scenario, seed=None)
    assert again == state
    assert imported.finish_reason is FinishReason.ABORT and imported.num_tokens == 3
    assert (stats["imported"], stats["exported"], stats["tokens"]) == (1, 1, 0)


def test_import_without_a_free_slot_waits_and_is_prefilled_again():
    free_transfer = SimEngineConfig(**{**CONFIG.__dict__, "kv_transfer_s_per_token": 0.0})

    async def scenario():
        loop = asyncio.get_running_loop()
        donor, receiver = engine("A", free_transfer), engine("B", free_transfer)
        busy = [asyncio.ensure_future(receiver.generate(request(rid))) for rid in ("x", "y")]
        _, state, _ = await export_after_three_steps(donor)
        generation = await receiver.import_request(state)
        done_at = loop.time()
        await asyncio.gather(*busy)
        return generation, done_at

    generation, done_at = run_shuffled(scenario, seed=None)
    # B runs x and y (prefill 4 tokens: 2 s, steps end at t=3..6) so a waits; x ends at t=6, a joins with a
    # prefill of its 5 context tokens (2.5 s) and ends 3 steps later
    assert done_at == 6.0 + 2.5 + 3.0
    assert generation.num_tokens == 6 and generation.versions == [0] * 6


def test_import_at_another_version_is_refused_naming_the_request_and_both_versions():
    async def scenario():
        _, state, _ = await export_after_three_steps(engine("A"))
        with pytest.raises(ValueError, match=r"request a: exported at v0, engine B at v1"):
            await engine("B", version=1).import_request(state)

    run_shuffled(scenario, seed=None)


def test_export_of_unknown_finished_waiting_and_paused_requests():
    async def scenario():
        loop = asyncio.get_running_loop()
        donor = engine("A")
        unknown = await donor.export_request("nope")
        await donor.generate(request("x"))  # prefill 1 s, 4 steps: ends at t=5
        finished = await donor.export_request("x")
        running, _ = (asyncio.ensure_future(donor.generate(request(rid))) for rid in ("a", "y"))
        await asyncio.sleep(0.5)  # a and y run (prefill 4 tokens: 2 s, first step ends at t=8)
        queued = asyncio.ensure_future(donor.generate(request("x")))
        await asyncio.sleep(2.0)  # x waits for a slot
        waiting = await donor.export_request("x")
        await donor.pause()  # at the end of the step in progress (a's first, t=8)
        paused_at = loop.time()
        paused = await donor.export_request("a")
        return unknown, finished, waiting, paused, paused_at, loop.time(), await running, await queued

    unknown, finished, waiting, paused, paused_at, now, running, queued = run_shuffled(scenario, seed=None)
    assert unknown is None and finished is None
    assert (waiting.produced, waiting.version_runs, waiting.kv_tokens, waiting.kv_bytes) == (0, (), 0, 0)
    assert queued.finish_reason is FinishReason.ABORT and queued.num_tokens == 0
    assert paused_at == now == 8.0  # a paused engine exports at once
    assert (paused.produced, paused.kv_tokens, paused.kv_bytes) == (1, 3, 300)
    assert running.finish_reason is FinishReason.ABORT and running.num_tokens == 1


def multi_version_config(**overrides: object) -> SimConfig:
    """4 engines, long-tailed responses, α = 1: updates leave requests of the old version to migrate."""
    config = {
        "timeline": "none",
        "num_prompts": 64,
        "prompt_tokens": 16,
        "lengths": {"distribution": "lognormal", "mean": 60.0, "sigma": 1.0},
        "engine": {"decode_step_s": 0.01, "max_running_requests": 8, "weight_update_s": 0.1},
        "trainer": {"num_gpus": 1, "gpu_s_per_token": 1e-4, "step_overhead_s": 0.5},
        "rollout": {
            "num_engines": 4,
            "rollout_batch_size": 4,
            "num_return_sequences": 4,
            "max_new_tokens": 512,
        },
        "buffer": {"async_ratio": 1.0},
        "controller": {"mode": "multi_version", "num_steps": 6},
    }
    return from_dict(SimConfig, config | overrides)


def test_multi_version_run_trains_one_version_per_trajectory_and_migrates(monkeypatch):
    spans: list[tuple[int, int]] = []
    train_step = workers.SimTrainer.train_step

    async def recording_train_step(self, groups, policy_version):
        spans.extend(t.version_span for g in groups for t in g.trajectories)
        return await train_step(self, groups, policy_version)

    monkeypatch.setattr(workers.SimTrainer, "train_step", recording_train_step)
    result = simulate(multi_version_config())
    totals = result.totals
    assert totals["num_steps"] == 6 and totals["trained_samples"] == 6 * 16 == len(spans)
    assert all(oldest == newest for oldest, newest in spans)
    assert totals["max_versions_alive"] == 2  # ⌊α⌋ + 1: versions overlapped, never more
    assert totals["num_migrations"] > 0 and totals["kv_bytes_moved"] > 0
    assert totals["kv_bytes_moved"] % SimEngineConfig().kv_bytes_per_token == 0
    assert totals["max_staleness"] <= 1
