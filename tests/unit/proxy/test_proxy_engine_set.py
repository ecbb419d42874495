"""EngineSet as LLMProxy uses it: engine calls as counted tasks, close / aclose, version-aware control failures."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import LLMProxy, ProxyClosed
from asyncrl.proxy.engine_set import EngineSet
from asyncrl.proxy.errors import EngineFailure
from asyncrl.proxy.worker import EngineWorker
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, make_request
from asyncrl.types import Request


def make_set(engines: list[FakeEngine], **config: object) -> EngineSet:
    return EngineSet(engines, ProxyConfig(**config), clock=asyncio.get_running_loop().time, owner="the test")


def test_a_cancelled_caller_aborts_its_request_and_the_call_counts_until_it_ends() -> None:
    async def scenario() -> None:
        ended: list[tuple[int, str]] = []

        def on_call_end(worker: EngineWorker, request: Request) -> None:
            ended.append((worker.index, request.request_id))

        engine = FakeEngine(lengths=100)
        engines = EngineSet(
            [engine], ProxyConfig(), clock=asyncio.get_running_loop().time, on_call_end=on_call_end
        )
        (worker,) = engines.workers
        request = make_request("r", max_new_tokens=200)
        caller = asyncio.ensure_future(engines.attempt(worker, request, lambda: engine.generate(request)))
        await asyncio.sleep(2.5)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert worker.in_flight and ended == []  # the engine may still be generating
        await asyncio.sleep(0.1)
        assert engine.calls == ["abort"] and not worker.in_flight and ended == [(0, "r")]

    run_shuffled(scenario, seed=3)


def test_close_ends_a_wait_for_an_engine_call_with_proxy_closed() -> None:
    async def scenario() -> None:
        engines = make_set([FakeEngine(hang=True)], request_timeout_s=60.0)
        (worker,) = engines.workers
        request = make_request("r")
        caller = asyncio.ensure_future(
            engines.attempt(worker, request, lambda: worker.client.generate(request))
        )
        await asyncio.sleep(1.0)
        engines.close()
        with pytest.raises(ProxyClosed, match="'r': the proxy was closed while engine 0 served it"):
            await caller
        assert asyncio.get_running_loop().time() == 1.0
        late = engines.spawn(asyncio.sleep(5.0))  # after close: cancelled at once
        await engines.aclose()
        assert late.cancelled() and not worker.in_flight

    run_shuffled(scenario, seed=4)


def test_aclose_returns_once_every_task_it_cancelled_has_ended() -> None:
    async def scenario() -> None:
        proxy = LLMProxy(
            [FakeEngine(hang=True, hang_control=True)],
            ProxyConfig(control_timeout_s=30.0),
            clock=asyncio.get_running_loop().time,
        )
        cancelled = asyncio.ensure_future(proxy.generate(make_request("r0")))
        served = asyncio.ensure_future(proxy.generate(make_request("r1")))
        await asyncio.sleep(1.0)
        cancelled.cancel()  # leaves an abort (hanging on this engine) to a background task
        await asyncio.sleep(1.0)
        await proxy.aclose()
        with pytest.raises(ProxyClosed):
            await served
        assert cancelled.cancelled() and asyncio.get_running_loop().time() == 2.0
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert proxy.stats()["engines"][0]["in_flight"] == 0

    run_shuffled(scenario, seed=5)


def test_control_failure_can_ask_only_about_engines_behind_a_version() -> None:
    async def scenario() -> None:
        engines = make_set([FakeEngine(), FakeEngine(), FakeEngine()])
        ahead, behind, _ = engines.workers
        ahead.version = 2
        for worker in (ahead, behind):
            engines.mark_unhealthy(worker, EngineFailure(worker.index, "update_weights", None))
        assert engines.control_failure() is ahead.control_error
        assert engines.control_failure(older_than=2) is behind.control_error
        assert engines.control_failure(older_than=0) is None
        assert engines.healthy_engines() == [2] and engines.versions() == [2, 0, 0]

    run_shuffled(scenario, seed=6)
