"""Engine recovery in the LLMProxy: dead and wedged engines are replaced, the replacement gets the latest weights
before any request, and the requests they held are re-routed, on the shuffled loop's virtual clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import EngineFailure, EnginesLost, LLMProxy, ProxyClosed
from asyncrl.proxy.recovery import Superseded
from asyncrl.proxy.worker import EngineClient
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import EngineDied, FakeEngine, expected_tokens, make_request
from asyncrl.types import FinishReason, Generation, Request


def run(main: Callable[[], Awaitable[Any]], seed: int | None = None) -> Any:
    return run_shuffled(main, seed, virtual_time=True)


class Factory:
    """Starts healthy ``FakeEngine``s; records what it replaced and what it started."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.replaced: list[tuple[int, EngineClient]] = []
        self.started: list[FakeEngine] = []

    async def replace(self, index: int, failed: EngineClient) -> EngineClient:
        self.replaced.append((index, failed))
        if self.fail:
            raise RuntimeError(f"engine {index}: no capacity to start a new one")
        engine = FakeEngine(lengths=4)
        self.started.append(engine)
        return engine


class DyingEngine(FakeEngine):
    """Dies like a killed actor once it has made ``after`` tokens of ``request_id``: every call in flight and
    every later call (generate or control) raise."""

    def __init__(self, request_id: str, after: int, **kwargs: Any) -> None:
        super().__init__(fail_after={request_id: after}, **kwargs)
        self.dead = False

    def _fail(self, run: Any, error: BaseException) -> None:
        self.dead = True
        super()._fail(run, error)
        for other in list(self.running.values()):  # the process is gone: every call on it fails at once
            if other.producer is not None:
                other.producer.cancel()
            super()._fail(other, EngineDied(f"actor died while serving {other.request.request_id}"))

    async def generate(self, request: Request) -> Generation:
        if self.dead:
            raise EngineDied("actor died")
        return await super().generate(request)

    async def _control(self, name: str) -> None:
        if self.dead:
            raise EngineDied("actor died")
        await super()._control(name)


class FailsOnce(FakeEngine):
    """Its first generate raises; everything else works (a transient error, not a dead engine)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failed = False

    async def generate(self, request: Request) -> Generation:
        if not self.failed:
            self.failed = True
            raise EngineDied("transient")
        return await super().generate(request)


def make_proxy(engines: list[FakeEngine], factory: Factory, **config: Any) -> LLMProxy:
    proxy = LLMProxy(engines, ProxyConfig(**config), clock=asyncio.get_running_loop().time)
    proxy.enable_recovery(factory)
    return proxy


def test_engine_dying_mid_generation_is_replaced_and_its_request_rerouted():
    async def main() -> None:
        dying = DyingEngine("r0", 2, lengths=4)
        factory = Factory()
        proxy = make_proxy([dying], factory, health_check_interval_s=None)
        generation = await proxy.generate(make_request("r0"))
        assert generation.token_ids == expected_tokens("r0", 4)[0]
        assert factory.replaced == [(0, dying)]
        (fresh,) = factory.started
        assert [r.request_id for r in fresh.received] == ["r0"]
        stats = proxy.stats()
        assert (stats["num_engine_restarts"], stats["num_retries"], stats["num_failed_probes"]) == (1, 1, 1)
        assert stats["engines"][0]["num_restarts"] == 1
        assert proxy.healthy_engines() == [0]

    for seed in range(20):
        run(main, seed)


def test_every_request_of_an_engine_dying_under_load_finishes_on_its_replacement():
    """More failures than ``max_consecutive_failures`` land while the recovery runs: the engine still comes
    back healthy, and every request is served."""

    async def main() -> None:
        dying = DyingEngine("r0", 1, lengths=4)
        factory = Factory()
        proxy = make_proxy([dying], factory, health_check_interval_s=None)
        generations = await asyncio.gather(*(proxy.generate(make_request(f"r{i}")) for i in range(6)))
        assert [g.token_ids for g in generations] == [expected_tokens(f"r{i}", 4)[0] for i in range(6)]
        assert proxy.healthy_engines() == [0]
        assert proxy.stats()["num_engine_restarts"] == 1

    for seed in range(20):
        run(main, seed)


def test_replacement_gets_the_latest_weights_before_any_request():
    async def main() -> None:
        dying = DyingEngine("r0", 1, lengths=4)
        factory = Factory()
        proxy = make_proxy([dying], factory, health_check_interval_s=None)
        await proxy.model_update({"w": 1}, 1)
        await proxy.update_applied(1)
        await proxy.model_update({"w": 2}, 2)
        await proxy.update_applied(2)
        generation = await proxy.generate(make_request("r0"))
        (fresh,) = factory.started
        assert [(version, tensors) for version, tensors in fresh.updates] == [(2, {"w": 2})]
        assert generation.versions == [2] * 4
        assert proxy.versions() == [2]

    for seed in range(20):
        run(main, seed)


def test_in_flight_policy_replacement_gets_the_update_sent_while_engines_were_paused():
    async def main() -> None:
        dying = DyingEngine("r0", 2, lengths=4)
        factory = Factory()
        proxy = make_proxy([dying], factory, update_policy="in_flight", health_check_interval_s=None)
        await proxy.suspend()
        await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        generation = await proxy.generate(make_request("r0"))
        (fresh,) = factory.started
        assert fresh.updates == [(1, {"w": 1})]
        assert (generation.token_ids, generation.versions) == (expected_tokens("r0", 4)[0], [1] * 4)

    for seed in range(20):
        run(main, seed)


def test_wedged_engine_is_found_by_the_patrol_and_its_requests_finish_elsewhere():
    async def main() -> None:
        wedged = FakeEngine(lengths=4, hang=True, hang_control=True)
        healthy = FakeEngine(lengths=4, step_s=3.0)
        factory = Factory()
        proxy = make_proxy(
            [wedged, healthy], factory, health_check_interval_s=10.0, health_check_timeout_s=5.0
        )
        generations = await asyncio.gather(*(proxy.generate(make_request(f"r{i}")) for i in range(4)))
        assert [g.token_ids for g in generations] == [expected_tokens(f"r{i}", 4)[0] for i in range(4)]
        assert [index for index, _ in factory.replaced] == [0]
        stats = proxy.stats()
        assert stats["num_reclaimed"] == sum(r.request_id.startswith("r") for r in wedged.received)
        assert stats["num_reclaimed"] >= 1
        assert (stats["num_engine_restarts"], stats["num_failed_probes"]) == (1, 1)
        assert proxy.healthy_engines() == [0, 1]
        await proxy.aclose()

    for seed in range(20):
        run(main, seed)


def test_drain_update_waits_for_the_replacement_and_is_not_applied_to_the_dead_engine():
    """An update pending on a wedged engine (it never drains) is not lost: the replacement is brought to it."""

    async def main() -> None:
        wedged = FakeEngine(lengths=4, hang=True, hang_control=True)
        factory = Factory()
        proxy = make_proxy([wedged], factory, health_check_interval_s=10.0, health_check_timeout_s=5.0)
        request = asyncio.ensure_future(proxy.generate(make_request("r0")))
        await asyncio.sleep(1.0)
        await proxy.model_update({"w": 1}, 1)
        await proxy.update_applied(1)
        generation = await request
        (fresh,) = factory.started
        assert fresh.updates == [(1, {"w": 1})]
        assert wedged.updates == []
        assert generation.versions == [1] * 4
        await proxy.aclose()

    for seed in range(20):
        run(main, seed)


def test_a_one_off_failure_keeps_the_engine_when_its_probe_answers():
    async def main() -> None:
        engine = FailsOnce(lengths=4)
        factory = Factory()
        proxy = make_proxy([engine], factory, health_check_interval_s=None)
        generation = await proxy.generate(make_request("r0"))
        assert generation.finish_reason is FinishReason.STOP
        assert (factory.replaced, engine.calls) == ([], ["abort"])  # probed once, kept
        assert (proxy.stats()["num_engine_restarts"], proxy.stats()["num_retries"]) == (0, 1)

    for seed in range(20):
        run(main, seed)


def test_failed_restart_leaves_the_engine_out_and_the_request_fails_with_its_name():
    async def main() -> None:
        dying = FakeEngine(lengths=4, fail_always=True)
        proxy = make_proxy([dying], Factory(fail=True), health_check_interval_s=None)
        with pytest.raises(Exception, match="r0"):
            await proxy.generate(make_request("r0"))
        assert proxy.healthy_engines() == []
        assert proxy.stats()["num_failed_restarts"] == 1

    for seed in range(10):
        run(main, seed)


def test_restarts_are_bounded_per_engine():
    async def main() -> None:
        factory = Factory()
        always_dying = FakeEngine(lengths=4, fail_always=True)

        async def replace(index: int, failed: EngineClient) -> EngineClient:
            factory.replaced.append((index, failed))
            return FakeEngine(lengths=4, fail_always=True)

        factory.replace = replace  # type: ignore[method-assign]
        proxy = make_proxy([always_dying], factory, health_check_interval_s=None, max_engine_restarts=2)
        for i in range(8):  # each request is tried max_consecutive_failures + 1 times, then fails
            with pytest.raises(Exception, match=f"r{i}"):
                await proxy.generate(make_request(f"r{i}"))
        assert len(factory.replaced) == 2
        assert proxy.stats()["num_engine_restarts"] == 2
        assert proxy.healthy_engines() == []

    for seed in range(10):
        run(main, seed)


def test_without_recovery_a_dead_engine_stays_out():
    async def main() -> None:
        dying = FakeEngine(lengths=4, fail_always=True)
        proxy = make_proxy([dying], Factory(), health_check_interval_s=None, max_engine_restarts=0)
        with pytest.raises(EngineFailure):
            await proxy.generate(make_request("r0"))
        assert "num_engine_restarts" not in proxy.stats()

    run(main)


def test_engines_lost_raises_once_the_last_engine_is_out_for_good_and_not_while_one_recovers():
    async def main() -> None:
        dying = DyingEngine("r0", 2, lengths=4)
        healthy = FakeEngine(lengths=4)
        factory = Factory(fail=True)
        proxy = make_proxy([dying, healthy], factory, health_check_interval_s=None)
        lost = asyncio.ensure_future(proxy.engines_lost())
        await proxy.generate(make_request("r0"))  # engine 0 dies, is not replaced; r0 ends on engine 1
        await asyncio.sleep(1.0)
        assert proxy.healthy_engines() == [1]
        assert not lost.done(), "one engine still serves"
        healthy.fail_always = True
        with pytest.raises(Exception, match="r1"):
            await proxy.generate(make_request("r1"))
        await asyncio.sleep(1.0)
        with pytest.raises(EnginesLost, match="engine 0.*restart.*: RuntimeError: .*no capacity"):
            await lost
        with pytest.raises(EnginesLost):  # asked again, it answers at once
            await proxy.engines_lost()
        await proxy.aclose()

    for seed in range(10):
        run(main, seed)


def test_engines_lost_ends_with_proxy_closed_when_the_proxy_closes():
    async def main() -> None:
        proxy = make_proxy([FakeEngine(lengths=4)], Factory(), health_check_interval_s=None)
        lost = asyncio.ensure_future(proxy.engines_lost())
        await asyncio.sleep(0.1)
        proxy.close()
        with pytest.raises(ProxyClosed):
            await lost

    run(main)


class Packed(dict):
    """A payload that names its version, as a ``WeightUpdate`` does (what a runtime's ``readable`` lends)."""

    def __init__(self, version: int, tensors: dict[str, Any]) -> None:
        super().__init__(tensors)
        self.version = version


def lending(version: int, events: list[Any], fresh: list[FakeEngine]) -> Any:
    """A ``readable`` hook that lends ``{"w": "again"}`` as ``version`` and records what happened around it."""

    @contextlib.asynccontextmanager
    async def readable(payload: Any, index: int) -> AsyncIterator[Any]:
        events.append(("lent", dict(payload), index))
        try:
            yield Packed(version, {"w": "again"})
        finally:
            events.append(("given back", list(fresh[0].updates), len(fresh[0].received)))

    return readable


async def applied_then_dying(factory: Factory, readable: Any) -> LLMProxy:
    """A proxy whose one engine applied v1 and dies on its next request, recovering through ``readable``."""
    engines = [DyingEngine("r0", 1, lengths=4)]
    proxy = LLMProxy(
        engines, ProxyConfig(health_check_interval_s=None), clock=asyncio.get_running_loop().time
    )
    proxy.enable_recovery(factory, readable)
    await proxy.model_update({"w": 1}, 1)
    await proxy.update_applied(1)
    return proxy


def test_a_replacement_applies_what_the_runtime_lends_and_it_is_given_back_before_it_serves():
    """``runtime.switch`` let go of the stored update: the runtime lends a copy packed again, of its version."""

    async def main() -> None:
        events: list[Any] = []
        factory = Factory()
        proxy = await applied_then_dying(factory, lending(1, events, factory.started))
        generation = await proxy.generate(make_request("r0"))
        (fresh,) = factory.started
        assert events == [("lent", {"w": 1}, 0), ("given back", [(1, {"w": "again"})], 0)]
        assert (fresh.updates, generation.versions) == ([(1, {"w": "again"})], [1] * 4)

    for seed in range(20):
        run(main, seed)


def test_a_lent_copy_of_another_version_is_refused_and_still_given_back(caplog):
    async def main() -> None:
        events: list[Any] = []
        factory = Factory()
        proxy = await applied_then_dying(factory, lending(2, events, factory.started))
        with pytest.raises(Exception, match="r0"):
            await proxy.generate(make_request("r0"))
        assert events == [("lent", {"w": 1}, 0), ("given back", [], 0)]
        assert (proxy.healthy_engines(), proxy.stats()["num_failed_restarts"]) == ([], 1)

    for seed in range(10):
        caplog.clear()
        run(main, seed)
        assert "catching up to v1, the runtime lent v2" in caplog.text


def superseding(asked: list[Any], gone: set[int], within_s: float = 60.0) -> Any:
    """A ``readable`` hook that can no longer lend the versions in ``gone`` (``runtime.switch``: the trainer let
    go of that copy and is training its next step) and lends any other as it is; records what it was asked."""

    @contextlib.asynccontextmanager
    async def readable(payload: Any, index: int) -> AsyncIterator[Any]:
        asked.append((dict(payload), index))
        if payload["w"] in gone:
            raise Superseded(f"v{payload['w']} let go, the trainer trains the next", within_s=within_s)
        yield payload

    return readable


def test_a_replacement_whose_update_was_let_go_waits_for_the_next_and_serves_that():
    """Replaced while the trainer trains: no copy of v1 can be lent, so the replacement stays in recovery (no
    request reaches it) until v2 is published, then applies v2, not the base weights, before serving."""

    async def main() -> None:
        asked: list[Any] = []
        factory = Factory()
        proxy = await applied_then_dying(factory, superseding(asked, gone={1}))
        served = asyncio.ensure_future(proxy.generate(make_request("r0")))
        while not asked:  # the replacement asked for v1 and was told to wait
            await asyncio.sleep(0.01)
        await asyncio.sleep(5)  # virtual time: it still waits, nothing reached it
        (fresh,) = factory.started
        assert (fresh.updates, fresh.received, served.done()) == ([], [], False)
        await proxy.model_update({"w": 2}, 2)
        await proxy.update_applied(2)
        generation = await served
        assert asked == [({"w": 1}, 0), ({"w": 2}, 0)]
        assert (fresh.updates, generation.versions) == ([(2, {"w": 2})], [2] * 4)
        assert (proxy.stats()["num_engine_restarts"], proxy.stats()["num_failed_restarts"]) == (1, 0)

    for seed in range(10):
        run(main, seed)


def test_a_replacement_told_to_wait_fails_by_name_when_no_update_comes(caplog):
    async def main() -> None:
        factory = Factory()
        proxy = await applied_then_dying(factory, superseding([], gone={1}, within_s=30))
        with pytest.raises(Exception, match="r0"):
            await proxy.generate(make_request("r0"))
        (fresh,) = factory.started
        assert (fresh.updates, proxy.healthy_engines(), proxy.stats()["num_failed_restarts"]) == ([], [], 1)

    for seed in range(5):
        caplog.clear()
        run(main, seed)
        assert "waited 30 s for an update newer than v1" in caplog.text
