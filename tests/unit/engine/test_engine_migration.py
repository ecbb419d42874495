"""Migrating a request with its KV between two engines of one version (engine/migration.py), on a tiny Qwen2."""

from __future__ import annotations

import asyncio
import copy

import pytest
from engine_testlib import drain, engine, request

from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.testing.pause_at import PauseAt
from asyncrl.types import FinishReason


def sampled(rid: str, **overrides):
    params = {"max_new_tokens": 24, "ignore_eos": True, "seed": 11, **overrides}
    return request(rid, [5, 6, 7, 8, 9, 10], **params)


def step_n(core, n: int) -> None:
    for _ in range(n):
        assert not core.step(), "the request finished before it could be migrated"


def forbid_prefill(core) -> None:
    def refuse(chunk):
        raise AssertionError(f"request {chunk.seq.request_id} was prefilled again")

    core.runner._prefill = refuse


def test_migrated_request_continues_token_identical_without_reprefill(qwen2) -> None:
    reference = drain(_loaded(engine(qwen2), sampled("r")))["r"]
    source, target = engine(qwen2), engine(copy.deepcopy(qwen2))
    source.add_request(sampled("r"))
    step_n(source, 8)  # prefill + 7 decode steps: 8 tokens out, the last one not yet in the KV
    state = source.export_request("r")
    assert state is not None and not source.has_work() and source.scheduler.kv_tokens_reserved == 0
    assert state.num_cached == 6 + 7 and len(state.output_token_ids) == 8
    assert state.kv_bytes == 2 * 2 * (2 * 13 * 16) * 4  # layers × (k, v) × heads·positions·head_dim × fp32
    assert target.import_request(state) is True
    forbid_prefill(target)
    migrated = drain(target)["r"]
    assert migrated.token_ids == reference.token_ids
    assert migrated.logprobs == pytest.approx(reference.logprobs, abs=1e-5)
    assert migrated.versions == reference.versions
    assert migrated.finish_reason is FinishReason.LENGTH


def test_migration_into_a_busy_engine_keeps_both_outputs(qwen2) -> None:
    alone = drain(_loaded(engine(qwen2), sampled("r"), sampled("other", seed=3, max_new_tokens=30)))
    source, target = engine(qwen2), engine(qwen2)
    source.add_request(sampled("r"))
    target.add_request(sampled("other", seed=3, max_new_tokens=30))
    step_n(source, 5)
    step_n(target, 3)
    assert target.import_request(source.export_request("r")) is True
    forbid_prefill(target)
    both = drain(target)
    assert both["r"].token_ids == alone["r"].token_ids
    assert both["other"].token_ids == alone["other"].token_ids


def test_import_without_a_free_slot_waits_and_prefills_again(qwen2) -> None:
    reference = drain(_loaded(engine(qwen2), sampled("r")))["r"]
    source, full = engine(qwen2), engine(qwen2, max_running_requests=1)
    source.add_request(sampled("r"))
    full.add_request(sampled("blocker", max_new_tokens=4))
    step_n(source, 4)
    step_n(full, 1)
    assert full.import_request(source.export_request("r")) is False
    assert [seq.request_id for seq in full.scheduler.waiting] == ["r"]
    assert drain(full)["r"].token_ids == reference.token_ids  # same draws; logits recomputed


def test_a_waiting_request_migrates_without_kv(qwen2) -> None:
    source = engine(qwen2, max_running_requests=1)
    source.add_request(sampled("first"))
    source.add_request(sampled("queued"))
    state = source.export_request("queued")
    assert state.num_cached == 0 and state.kv == () and state.output_token_ids == []
    target = engine(qwen2)
    assert target.import_request(state) is False
    assert (
        drain(target)["queued"].token_ids
        == drain(_loaded(engine(qwen2), sampled("queued")))["queued"].token_ids
    )


def test_import_refuses_another_version_and_a_duplicate_id(qwen2) -> None:
    source = engine(qwen2)
    source.add_request(sampled("r"))
    step_n(source, 2)
    state = source.export_request("r")
    newer = engine(qwen2)
    newer.version = 1
    with pytest.raises(ValueError, match="exported at version 0"):
        newer.import_request(state)
    same = engine(qwen2)
    same.add_request(sampled("r"))
    with pytest.raises(ValueError, match="already in flight"):
        same.import_request(state)
    assert source.export_request("unknown") is None


def test_async_engine_export_returns_the_partial_and_import_finishes_it(qwen2) -> None:
    async def scenario():
        source = AsyncEngine(engine(qwen2))
        target = AsyncEngine(engine(qwen2))
        try:
            hold = PauseAt([source], "r", 3)  # paused on its own step thread: the export lands mid-generation
            call = asyncio.ensure_future(source.generate(sampled("r", max_new_tokens=100)))
            await hold.reached()
            state = await source.export_request("r")
            partial = await call
            finished = await target.import_request(state)
            return state, partial, finished
        finally:
            source.shutdown()
            target.shutdown()

    state, partial, finished = asyncio.run(scenario())
    assert partial.finish_reason is FinishReason.ABORT and partial.token_ids == state.output_token_ids
    assert state.num_cached >= 6 + 2
    reference = drain(_loaded(engine(qwen2), sampled("r", max_new_tokens=100)))["r"]
    assert finished.token_ids == reference.token_ids and finished.finish_reason is FinishReason.LENGTH


def _loaded(core, *requests):
    for req in requests:
        core.add_request(req)
    return core
