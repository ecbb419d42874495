"""LLMProxy request path against fake engines: routing, timeouts, failures, health, retry, abort, close, stats.

Every scenario runs on the shuffled loop's virtual clock (FIFO order here), so one fake token takes one
virtual second and timeouts of minutes take microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import EngineFailure, LLMProxy, NoHealthyEngine, ProxyClosed, RequestTimeout
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import EngineDied, FakeEngine, expected_tokens, make_request
from asyncrl.types import FinishReason


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return run_shuffled(main, None, virtual_time=True)


def make_proxy(engines: list[FakeEngine], **config: Any) -> LLMProxy:
    return LLMProxy(engines, ProxyConfig(**config), clock=asyncio.get_running_loop().time)


def received_ids(engine: FakeEngine) -> list[str]:
    return [request.request_id for request in engine.received]


def test_generate_returns_the_engine_output_and_counts_it():
    async def main() -> None:
        engine = FakeEngine(lengths=4)
        proxy = make_proxy([engine])
        generation = await proxy.generate(make_request("r0"))
        tokens, logprobs = expected_tokens("r0", 4)
        assert (generation.token_ids, generation.logprobs, generation.versions) == (tokens, logprobs, [0] * 4)
        assert generation.finish_reason is FinishReason.STOP
        stats = proxy.stats()["engines"][0]
        assert (stats["in_flight"], stats["total_tokens"], stats["num_requests"]) == (0, 4, 1)

    run(main)


def test_least_loaded_routing_then_fewer_tokens_then_index():
    async def main() -> None:
        engines = [FakeEngine(lengths=10) for _ in range(3)]
        proxy = make_proxy(engines)
        requests = [
            make_request("r0"),
            make_request("r1", max_new_tokens=8),
            make_request("r2"),
            make_request("r3"),
        ]
        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(proxy.generate(request)))
            await asyncio.sleep(0)
        await asyncio.sleep(0.1)
        # r0, r1, r2 spread one per engine; r3 ties on requests and goes to engine 1 (11 tokens < 19).
        assert [received_ids(e) for e in engines] == [["r0"], ["r1", "r3"], ["r2"]]
        assert [s["in_flight_tokens"] for s in proxy.stats()["engines"]] == [19, 30, 19]
        await asyncio.gather(*tasks)

    run(main)


def test_affinity_keeps_a_prompt_on_its_engine_within_the_slack():
    async def main() -> None:
        engines = [FakeEngine(lengths=10) for _ in range(2)]
        proxy = make_proxy(engines, affinity_slack=1)
        keys = [("a", "p"), ("b", "p"), ("c", "p"), ("d", "q")]
        tasks = []
        for request_id, key in keys:
            tasks.append(asyncio.create_task(proxy.generate(make_request(request_id, affinity_key=key))))
            await asyncio.sleep(0)
        await asyncio.sleep(0.1)
        # a → 0; b joins its key on 0 (1 <= 0 + 1); c: 2 > 0 + 1, goes to 1; d: least loaded is 1.
        assert [received_ids(e) for e in engines] == [["a", "b"], ["c", "d"]]
        await asyncio.gather(*tasks)
        assert len(proxy._affinity) == 0

    run(main)


def test_timeout_aborts_on_the_engine_and_names_request_and_engine():
    async def main() -> None:
        engine = FakeEngine(lengths=100)
        proxy = make_proxy([engine], request_timeout_s=5.0)
        with pytest.raises(RequestTimeout, match=r"'r0'.*after 5.0 s on engine 0") as caught:
            await proxy.generate(make_request("r0", max_new_tokens=200))
        assert isinstance(caught.value, TimeoutError)
        assert (caught.value.request_id, caught.value.engine_index) == ("r0", 0)
        assert engine.calls == ["abort"] and engine.running == {}
        assert asyncio.get_running_loop().time() == 5.0
        stats = proxy.stats()
        assert (
            stats["num_timeouts"],
            stats["engines"][0]["in_flight"],
            stats["engines"][0]["num_failures"],
        ) == (1, 0, 1)

    run(main)


def test_timeout_on_a_hung_engine_is_bounded_by_the_control_timeout():
    async def main() -> None:
        engine = FakeEngine(hang=True, hang_control=True)
        proxy = make_proxy([engine], request_timeout_s=5.0, control_timeout_s=3.0)
        with pytest.raises(RequestTimeout):
            await proxy.generate(make_request("r0"))
        # 5 s request timeout + 3 s for abort to answer + 3 s for the call to return, then it is cancelled.
        assert asyncio.get_running_loop().time() == 11.0
        assert proxy.stats()["engines"][0]["in_flight"] == 0

    run(main)


def test_engine_error_reaches_the_caller_wrapped_with_request_and_engine():
    async def main() -> None:
        proxy = make_proxy([FakeEngine(fail_always=True)])
        with pytest.raises(EngineFailure, match="engine 0 failed generate for request 'r0'") as caught:
            await proxy.generate(make_request("r0"))
        assert (caught.value.engine_index, caught.value.request_id) == (0, "r0")
        assert isinstance(caught.value.__cause__, EngineDied)

    run(main)


def test_engine_is_unhealthy_after_consecutive_failures_and_no_longer_routed():
    async def main() -> None:
        broken, good = FakeEngine(fail_always=True), FakeEngine()
        proxy = make_proxy([broken, good], max_consecutive_failures=2)
        for request_id in ("r0", "r1"):
            with pytest.raises(EngineFailure):
                await proxy.generate(make_request(request_id))
        assert proxy.healthy_engines() == [1]
        await proxy.generate(make_request("r2"))
        assert (received_ids(broken), received_ids(good)) == (["r0", "r1"], ["r2"])
        assert [s["healthy"] for s in proxy.stats()["engines"]] == [False, True]

    run(main)


def test_a_success_resets_the_consecutive_failure_count():
    async def main() -> None:
        engine = FakeEngine(fail_after={"r0": 0, "r2": 0})
        proxy = make_proxy([engine], max_consecutive_failures=2)
        for request_id in ("r0", "r1", "r2"):
            with contextlib.suppress(EngineFailure):
                await proxy.generate(make_request(request_id))
        assert proxy.healthy_engines() == [0]
        assert proxy.stats()["engines"][0]["num_failures"] == 2

    run(main)


def test_no_healthy_engine_is_an_error_naming_the_request():
    async def main() -> None:
        proxy = make_proxy([FakeEngine(fail_always=True)], max_consecutive_failures=1)
        with pytest.raises(EngineFailure):
            await proxy.generate(make_request("r0"))
        with pytest.raises(NoHealthyEngine, match="'r1'"):
            await proxy.generate(make_request("r1"))

    run(main)


def test_failure_is_not_retried_unless_configured():
    async def main() -> None:
        dying, good = FakeEngine(fail_after={"r0": 2}), FakeEngine()
        proxy = make_proxy([dying, good])
        with pytest.raises(EngineFailure):
            await proxy.generate(make_request("r0"))
        assert received_ids(good) == []

    run(main)


def test_retry_reruns_on_another_healthy_engine_when_configured():
    async def main() -> None:
        dying, good = FakeEngine(fail_after={"r0": 2}, version=0), FakeEngine(version=0)
        proxy = make_proxy([dying, good], retry_on_engine_failure=True)
        generation = await proxy.generate(make_request("r0"))
        assert generation.token_ids == expected_tokens("r0", 4)[0]
        assert received_ids(good) == ["r0"] and good.received[0].prefix_token_ids == []
        assert proxy.stats()["num_retries"] == 1

    run(main)


def test_abort_on_engine_returns_the_partial_output_to_both_sides():
    async def main() -> None:
        engine = FakeEngine(lengths=10)
        proxy = make_proxy([engine])
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(3.5)
        partial = await proxy.abort("r0")
        assert partial is not None and partial.token_ids == expected_tokens("r0", 3)[0]
        assert partial.finish_reason is FinishReason.ABORT
        assert await task == partial
        assert await proxy.abort("r0") is None and await proxy.abort("unknown") is None

    run(main)


def test_abort_of_a_held_request_wakes_it_without_touching_an_engine():
    async def main() -> None:
        engine = FakeEngine()
        proxy = make_proxy([engine])
        await proxy.suspend()
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(1)
        assert proxy.stats()["num_held"] == 1
        partial = await proxy.abort("r0")
        generation = await task
        assert partial == generation and generation.token_ids == []
        assert generation.finish_reason is FinishReason.ABORT and engine.received == []

    run(main)


def test_cancelling_generate_aborts_the_request_on_its_engine():
    async def main() -> None:
        engine = FakeEngine(lengths=10)
        proxy = make_proxy([engine])
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(2.5)
        task.cancel()
        await asyncio.sleep(0.1)
        assert engine.calls == ["abort"] and engine.running == {}
        assert proxy.stats()["engines"][0]["in_flight"] == 0 and proxy.stats()["num_calls"] == 0

    run(main)


def test_close_fails_every_waiter_with_a_clear_error():
    async def main() -> None:
        engine = FakeEngine(lengths=100)
        proxy = make_proxy([engine])
        on_engine = asyncio.create_task(proxy.generate(make_request("r0", max_new_tokens=200)))
        await asyncio.sleep(0.5)
        await proxy.model_update({"w": 1}, 1)
        applied = asyncio.create_task(proxy.update_applied(1))
        await proxy.suspend()
        held = asyncio.create_task(proxy.generate(make_request("r1")))
        await asyncio.sleep(2)
        proxy.close()
        for task in (on_engine, applied, held):
            with pytest.raises(ProxyClosed):
                await task
        with pytest.raises(ProxyClosed):
            await proxy.generate(make_request("r2"))

    run(main)


def test_duplicate_request_id_is_rejected():
    async def main() -> None:
        proxy = make_proxy([FakeEngine(lengths=10)])
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="'r0' is already in flight"):
            await proxy.generate(make_request("r0"))
        await task

    run(main)


def test_stats_report_busy_time_and_idle_fraction_since_start():
    async def main() -> None:
        engines = [FakeEngine(lengths=4), FakeEngine()]
        proxy = make_proxy(engines)
        await proxy.generate(make_request("r0"))
        await asyncio.sleep(4)
        first, second = proxy.stats()["engines"]
        assert (first["busy_seconds"], first["idle_fraction"]) == (4.0, 0.5)
        assert (second["busy_seconds"], second["idle_fraction"]) == (0.0, 1.0)

    run(main)


def test_stats_integrate_requests_in_flight_over_time():
    """Two requests in flight for 4 s, then 4 s idle: 8 request-seconds (mean concurrency 2 while busy, 1
    over the whole 8 s), read the same mid-call as after it."""

    async def main() -> None:
        proxy = make_proxy([FakeEngine(lengths=4)])
        calls = [asyncio.create_task(proxy.generate(make_request(f"r{i}"))) for i in range(2)]
        await asyncio.sleep(1)
        assert proxy.stats()["engines"][0]["request_seconds"] == 2.0
        await asyncio.gather(*calls)
        await asyncio.sleep(4)
        (stats,) = proxy.stats()["engines"]
        assert (stats["request_seconds"], stats["busy_seconds"], stats["mean_in_flight"]) == (8.0, 4.0, 1.0)

    run(main)
