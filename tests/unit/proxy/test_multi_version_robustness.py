"""The multi-version orchestrator when engines misbehave: request timeouts, failing engines, affinity."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.errors import EngineFailure, NoHealthyEngine, RequestTimeout
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.sim.clock import run_seeds, run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, expected_tokens, make_request
from asyncrl.types import FinishReason

NUM_SEEDS = 100


def make_proxy(engines: list[FakeEngine], **config: object) -> MultiVersionProxy:
    return MultiVersionProxy(
        engines, ProxyConfig(**config), async_ratio=1.0, clock=asyncio.get_running_loop().time
    )


async def timeout_scenario(retry: bool) -> tuple[object, list[FakeEngine], dict]:
    """Engine 0 never answers; the request is routed there first (least loaded, lower index)."""
    engines = [FakeEngine(hang=True), FakeEngine(lengths=4)]
    proxy = make_proxy(
        engines,
        request_timeout_s=10.0,
        control_timeout_s=5.0,
        max_consecutive_failures=1,
        retry_on_engine_failure=retry,
    )
    try:
        outcome = await proxy.generate(make_request("x", max_new_tokens=4))
    except RequestTimeout as timeout:
        outcome = timeout
    return outcome, engines, proxy.stats()


def test_a_request_past_its_timeout_is_aborted_on_its_engine_and_reported() -> None:
    timeout, engines, stats = run_shuffled(lambda: timeout_scenario(retry=False), seed=0)
    assert isinstance(timeout, RequestTimeout)
    assert (timeout.request_id, timeout.engine_index, timeout.timeout_s) == ("x", 0, 10.0)
    assert engines[0].calls == ["abort"]
    assert (stats["num_timeouts"], stats["num_retries"], stats["num_calls"]) == (1, 0, 0)
    assert [e["healthy"] for e in stats["engines"]] == [False, True]


def test_a_timed_out_request_is_retried_on_another_engine_when_allowed() -> None:
    async def one(seed: int) -> None:
        generation, engines, stats = await timeout_scenario(retry=True)
        assert generation.token_ids == expected_tokens("x", 4)[0] and generation.versions == [0] * 4
        assert [r.request_id for r in engines[1].received] == ["x"]
        assert (stats["num_timeouts"], stats["num_retries"], stats["num_calls"]) == (1, 1, 0)

    assert run_seeds(one, range(NUM_SEEDS)) == NUM_SEEDS


async def failing_engine_scenario(retry: bool) -> tuple[list[object], list[FakeEngine], dict]:
    """Both requests share an affinity key, so both land on engine 0, which dies on "b" after two tokens:
    it turns unhealthy and "a" moves to engine 1 (same version) with its state; "b" is retried or fails."""
    engines = [FakeEngine(lengths=20, fail_after={"b": 2}), FakeEngine(lengths=20)]
    proxy = make_proxy(engines, max_consecutive_failures=1, retry_on_engine_failure=retry)
    calls = [
        asyncio.ensure_future(proxy.generate(make_request(rid, max_new_tokens=20, affinity_key="prompt")))
        for rid in ("a", "b")
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    return outcomes, engines, proxy.stats()


def test_an_engine_turned_unhealthy_hands_its_requests_to_a_healthy_one_of_their_version() -> None:
    async def one(seed: int) -> None:
        (moved, retried), engines, stats = await failing_engine_scenario(retry=True)
        assert sorted(r.request_id for r in engines[0].received) == ["a", "b"]  # affinity kept them together
        assert (engines[0].exported, engines[1].imported) == (["a"], ["a"])
        for generation in (moved, retried):  # complete, as if uninterrupted, one version each
            tokens, logprobs = expected_tokens(generation.request_id, 20)
            assert (generation.token_ids, generation.logprobs) == (tokens, logprobs)
            assert generation.versions == [0] * 20 and generation.finish_reason is FinishReason.LENGTH
        assert (stats["num_evacuations"], stats["num_migrations"], stats["num_retries"]) == (1, 1, 1)
        assert [e["healthy"] for e in stats["engines"]] == [False, True]

    assert run_seeds(one, range(NUM_SEEDS)) == NUM_SEEDS


def test_without_retries_the_failed_request_reaches_its_caller_and_the_others_still_finish() -> None:
    (moved, failed), _, stats = run_shuffled(lambda: failing_engine_scenario(retry=False), seed=4)
    assert moved.token_ids == expected_tokens("a", 20)[0]
    assert isinstance(failed, EngineFailure) and (failed.engine_index, failed.request_id) == (0, "b")
    assert (stats["num_evacuations"], stats["num_retries"]) == (1, 0)


def test_with_no_healthy_engine_left_a_request_fails_instead_of_waiting_forever() -> None:
    async def scenario() -> None:
        proxy = make_proxy(
            [FakeEngine(fail_always=True)], max_consecutive_failures=1, retry_on_engine_failure=True
        )
        with pytest.raises(EngineFailure, match="engine 0 failed generate for request 'first'"):
            await proxy.generate(make_request("first"))
        with pytest.raises(NoHealthyEngine, match="'second': no healthy engine serves v0"):
            await proxy.generate(make_request("second"))

    run_shuffled(scenario, seed=5)
