"""EngineSet, the per-engine bookkeeping the multi-version orchestrator (and later LLMProxy) is built on."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.engine_set import EngineSet
from asyncrl.proxy.errors import EngineFailure, RequestTimeout
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, make_request


def make_set(engines: list[FakeEngine], **config: object) -> EngineSet:
    return EngineSet(engines, ProxyConfig(**config), clock=asyncio.get_running_loop().time, owner="the test")


def test_an_empty_engine_set_names_its_owner() -> None:
    with pytest.raises(ValueError, match="the test needs at least one engine"):
        EngineSet([], ProxyConfig(), owner="the test")


def test_an_attempt_counts_in_flight_tokens_and_health() -> None:
    async def scenario() -> None:
        engines = make_set([FakeEngine(lengths=3, step_s=2.0)])
        (worker,) = engines.workers
        request = make_request("r", max_new_tokens=8)
        call = asyncio.ensure_future(
            engines.attempt(worker, request, lambda: worker.client.generate(request))
        )
        await asyncio.sleep(1.0)
        assert worker.num_in_flight_tokens == 3 + 8  # prompt + max_new_tokens
        worker.consecutive_failures = 2
        generation = await call
        assert generation.num_tokens == 3
        assert (worker.num_in_flight_tokens, worker.total_tokens, worker.consecutive_failures) == (0, 3, 0)
        assert engines.engine_stats()[0]["busy_seconds"] == 6.0

    run_shuffled(scenario, seed=0)


def test_failures_and_timeouts_count_against_health_until_unhealthy() -> None:
    async def scenario() -> None:
        engines = make_set(
            [FakeEngine(fail_always=True), FakeEngine(hang=True)],
            request_timeout_s=3.0,
            control_timeout_s=1.0,
            max_consecutive_failures=2,
        )
        failing, hanging = engines.workers
        request = make_request("r")
        for _ in range(2):
            with pytest.raises(EngineFailure, match="engine 0 failed generate for request 'r'"):
                await engines.attempt(failing, request, lambda: failing.client.generate(request))
        with pytest.raises(RequestTimeout, match="'r' timed out after 3.0 s on engine 1"):
            await engines.attempt(hanging, request, lambda: hanging.client.generate(request))
        assert asyncio.get_running_loop().time() == 3.0 + 1.0  # the timeout, then one control timeout to reap
        assert engines.healthy_engines() == [1] and hanging.consecutive_failures == 1
        assert not hanging.in_flight

    run_shuffled(scenario, seed=1)


def test_a_control_call_past_its_timeout_is_an_engine_failure() -> None:
    async def scenario() -> None:
        engines = make_set([FakeEngine(hang_control=True)], control_timeout_s=2.0)
        (worker,) = engines.workers
        with pytest.raises(EngineFailure, match="engine 0 failed pause for the proxy") as failure:
            await engines.control(worker, "pause")
        engines.mark_unhealthy(worker, failure.value)
        assert engines.control_failure() is failure.value and engines.healthy_engines() == []

    run_shuffled(scenario, seed=2)
