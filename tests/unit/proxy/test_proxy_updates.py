"""The weight-update protocol over fake engines: ``drain`` (one version per generation) and ``in_flight``
(pause, update, resume mid-generation, with transparent continuation of unasked aborts)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import torch

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import EngineFailure, LLMProxy, NoHealthyEngine
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, expected_tokens, make_request
from asyncrl.types import FinishReason


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return run_shuffled(main, None, virtual_time=True)


def make_proxy(engines: list[FakeEngine], policy: str, **config: Any) -> LLMProxy:
    return LLMProxy(
        engines, ProxyConfig(update_policy=policy, **config), clock=asyncio.get_running_loop().time
    )


def now() -> float:
    return asyncio.get_running_loop().time()


# ------------------------------------------------------------------------------------------------ drain


def test_drain_applies_the_update_only_after_in_flight_requests_finish():
    async def main() -> None:
        engine = FakeEngine(lengths=4)
        proxy = make_proxy([engine], "drain")
        first = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(1.5)
        await proxy.model_update({"w": 1}, 1)
        assert now() == 1.5 and proxy.versions() == [0]
        second = asyncio.create_task(proxy.generate(make_request("r1")))
        await proxy.update_applied(1)
        assert now() == 4.0 and proxy.versions() == [1]
        assert (await first).versions == [0] * 4
        assert (await second).versions == [1] * 4
        assert engine.running_at_update == [0] and [v for v, _ in engine.updates] == [1]
        assert engine.calls == ["pause", "update_weights", "resume"]

    run(main)


def test_drain_routes_new_requests_to_engines_already_updated():
    async def main() -> None:
        busy, idle = FakeEngine(lengths=10), FakeEngine(lengths=10)
        proxy = make_proxy([busy, idle], "drain")
        first = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(0.5)
        await proxy.model_update({"w": 1}, 1)
        await asyncio.sleep(0.5)
        assert proxy.versions() == [0, 1]
        later = [asyncio.create_task(proxy.generate(make_request(f"r{i}"))) for i in (1, 2)]
        await asyncio.sleep(0.5)
        assert [r.request_id for r in idle.received] == ["r1", "r2"]
        assert proxy.stats()["engines"][0]["pending_version"] == 1
        for generation in await asyncio.gather(first, *later):
            assert len(set(generation.versions)) == 1
        assert proxy.versions() == [1, 1]

    run(main)


def test_drain_applies_only_the_newest_of_several_pending_updates():
    async def main() -> None:
        engine = FakeEngine(lengths=4)
        proxy = make_proxy([engine], "drain")
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(1)
        await proxy.model_update({"w": 1}, 1)
        await proxy.model_update({"w": 2}, 2)
        await proxy.update_applied(1)
        assert [v for v, _ in engine.updates] == [2] and proxy.versions() == [2]
        await task

    run(main)


@pytest.mark.parametrize("make_weight", [lambda: torch.zeros(3), lambda: np.zeros(3)])
def test_drain_snapshots_weights_so_later_trainer_steps_do_not_leak(make_weight: Callable[[], Any]):
    async def main() -> None:
        engine = FakeEngine(lengths=4)
        proxy = make_proxy([engine], "drain")
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(1)
        weight = make_weight()
        await proxy.model_update({"w": weight}, 1)
        weight += 5  # the trainer's next optimizer step, in place, while the engine still drains
        await proxy.update_applied(1)
        applied = engine.updates[0][1]["w"]
        assert applied is not weight and applied.tolist() == [0.0, 0.0, 0.0]
        await task

    run(main)


def test_drain_update_failure_makes_the_engine_unhealthy_and_reaches_update_applied():
    async def main() -> None:
        broken, good = FakeEngine(fail_control=frozenset({"update_weights"})), FakeEngine()
        proxy = make_proxy([broken, good], "drain")
        await proxy.model_update({"w": 1}, 1)
        with pytest.raises(EngineFailure, match="engine 0 failed update_weights"):
            await proxy.update_applied(1)
        assert proxy.healthy_engines() == [1] and proxy.versions() == [0, 1]

    run(main)


def test_update_applied_times_out_naming_the_lagging_engines():
    async def main() -> None:
        proxy = make_proxy([FakeEngine(lengths=100), FakeEngine()], "drain")
        task = asyncio.create_task(proxy.generate(make_request("r0", max_new_tokens=200)))
        await asyncio.sleep(0.5)
        await proxy.model_update({"w": 1}, 1)
        with pytest.raises(TimeoutError, match=r"version 1 not applied after 5.0 s on engines \[0\]"):
            await proxy.update_applied(1, timeout_s=5.0)
        await proxy.abort("r0")
        await task

    run(main)


def test_versions_must_increase_and_update_applied_needs_a_sent_version():
    async def main() -> None:
        proxy = make_proxy([FakeEngine()], "drain")
        await proxy.model_update({"w": 1}, 1)
        with pytest.raises(ValueError, match="must exceed 1, got 1"):
            await proxy.model_update({"w": 1}, 1)
        with pytest.raises(ValueError, match="version 2 was never sent"):
            await proxy.update_applied(2)

    run(main)


def test_drain_suspend_holds_new_calls_while_in_flight_ones_finish():
    async def main() -> None:
        engine = FakeEngine(lengths=3)
        proxy = make_proxy([engine], "drain")
        first = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(0.5)
        await proxy.suspend()
        held = asyncio.create_task(proxy.generate(make_request("r1")))
        assert (await first).versions == [0, 0, 0] and now() == 3.0
        await asyncio.sleep(2)
        assert [r.request_id for r in engine.received] == ["r0"] and proxy.stats()["num_held"] == 1
        await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        assert (await held).versions == [1, 1, 1]

    run(main)


def test_version_pinned_requests_only_run_at_their_version():
    async def main() -> None:
        engines = [FakeEngine(), FakeEngine()]
        proxy = make_proxy(engines, "drain")
        await proxy.model_update({"w": 1}, 1)
        await proxy.update_applied(1)
        assert (await proxy.generate(make_request("r0", version=1))).versions == [1] * 4
        with pytest.raises(NoHealthyEngine, match="'r1': no healthy engine at version 0"):
            await proxy.generate(make_request("r1", version=0))

    run(main)


# ---------------------------------------------------------------------------------------------- in_flight


def test_in_flight_update_lands_mid_generation_with_per_token_versions():
    async def main() -> None:
        engine = FakeEngine(lengths=6)
        proxy = make_proxy([engine], "in_flight")
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(2.5)
        await proxy.suspend()
        await proxy.model_update({"w": 1}, 1)
        await asyncio.sleep(2)
        await proxy.resume()
        generation = await task
        assert generation.token_ids == expected_tokens("r0", 6)[0]
        assert generation.versions == [0, 0, 1, 1, 1, 1]
        assert len(engine.received) == 1 and engine.calls == ["pause", "update_weights", "resume"]

    run(main)


def test_in_flight_continuation_of_an_unasked_abort_stitches_exactly():
    async def main() -> None:
        engines = [FakeEngine(lengths=6, abort_on_pause=True), FakeEngine(lengths=6, abort_on_pause=True)]
        proxy = make_proxy(engines, "in_flight")
        task = asyncio.create_task(proxy.generate(make_request("r0", max_new_tokens=8)))
        await asyncio.sleep(2.5)
        await proxy.suspend()
        await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        generation = await task
        tokens, logprobs = expected_tokens("r0", 6)
        assert (generation.token_ids, generation.logprobs) == (tokens, logprobs)
        assert generation.versions == [0, 0, 1, 1, 1, 1]
        assert generation.finish_reason is FinishReason.STOP
        continuation = engines[0].received[1]
        assert (continuation.prefix_token_ids, continuation.prefix_logprobs) == (tokens[:2], logprobs[:2])
        assert continuation.prefix_versions == [0, 0] and continuation.sampling.max_new_tokens == 8
        assert proxy.stats()["num_continuations"] == 1

    run(main)


def test_in_flight_continuation_may_migrate_to_another_engine():
    async def main() -> None:
        engines = [FakeEngine(lengths=20, abort_on_pause=True), FakeEngine(lengths=20, abort_on_pause=True)]
        proxy = make_proxy(engines, "in_flight")
        first = asyncio.create_task(proxy.generate(make_request("r0", max_new_tokens=30)))
        second = asyncio.create_task(proxy.generate(make_request("r1", max_new_tokens=30)))
        await asyncio.sleep(3.5)
        await proxy.suspend()
        await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        third = asyncio.create_task(proxy.generate(make_request("r2", max_new_tokens=30)))
        for request_id, generation in zip(
            ("r0", "r1", "r2"), await asyncio.gather(first, second, third), strict=True
        ):
            assert generation.token_ids == expected_tokens(request_id, 20)[0]
        assert (await first).versions == [0] * 3 + [1] * 17

    run(main)


def test_in_flight_gives_up_after_max_continuations():
    async def main() -> None:
        engine = FakeEngine(lengths=6, abort_on_pause=True)
        proxy = make_proxy([engine], "in_flight", max_continuations=0)
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(2.5)
        await proxy.suspend()
        generation = await task
        assert generation.finish_reason is FinishReason.ABORT and len(generation.token_ids) == 2
        await proxy.resume()

    run(main)


def test_caller_abort_of_a_request_waiting_for_its_continuation():
    async def main() -> None:
        engine = FakeEngine(lengths=6, abort_on_pause=True)
        proxy = make_proxy([engine], "in_flight")
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(2.5)
        await proxy.suspend()
        await asyncio.sleep(0.1)
        partial = await proxy.abort("r0")
        assert partial is not None and partial.token_ids == expected_tokens("r0", 2)[0]
        assert await task == partial and partial.finish_reason is FinishReason.ABORT
        await proxy.resume()
        assert len(engine.received) == 1

    run(main)


def test_in_flight_model_update_needs_suspend():
    async def main() -> None:
        proxy = make_proxy([FakeEngine()], "in_flight")
        with pytest.raises(RuntimeError, match="call suspend"):
            await proxy.model_update({"w": 1}, 1)

    run(main)


def test_in_flight_update_failure_is_raised_and_the_engine_dropped():
    async def main() -> None:
        engines = [FakeEngine(), FakeEngine(fail_control=frozenset({"update_weights"}))]
        proxy = make_proxy(engines, "in_flight")
        await proxy.suspend()
        with pytest.raises(EngineFailure, match="engine 1 failed update_weights"):
            await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        assert proxy.healthy_engines() == [0] and proxy.versions() == [1, 0]
        assert (await proxy.generate(make_request("r0"))).versions == [1] * 4
        with pytest.raises(EngineFailure):
            await proxy.update_applied(1)

    run(main)


def test_in_flight_requests_arriving_during_suspend_start_on_the_new_weights():
    async def main() -> None:
        engine = FakeEngine(lengths=2)
        proxy = make_proxy([engine], "in_flight")
        await proxy.suspend()
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(1)
        await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        assert (await task).versions == [1, 1]

    run(main)


class SlottedEngine(FakeEngine):
    """A ``FakeEngine`` that runs at most ``slots`` requests at once and queues the rest, as a real engine
    does; ``queued_at_update`` records how many it held beyond its slots when each update came."""

    def __init__(self, slots: int) -> None:
        super().__init__(lengths=4, step_s=1.0)
        self._slots = asyncio.Semaphore(slots)
        self.waiting = 0
        self.queued_at_update: list[int] = []

    async def generate(self, request):  # type: ignore[no-untyped-def]
        self.waiting += 1
        async with self._slots:
            self.waiting -= 1
            return await super().generate(request)

    async def update_weights(self, named_tensors, version):  # type: ignore[no-untyped-def]
        self.queued_at_update.append(self.waiting)
        await super().update_weights(named_tensors, version)


def test_a_drain_waits_only_for_the_calls_the_engine_runs_and_the_held_ones_run_on_the_new_version():
    """Ten calls on an engine of two slots: the proxy sends two and holds eight; an update pending meanwhile
    lands once those two finish, and the eight run on it (none queued on the engine behind the drain)."""

    async def main() -> None:
        engine = SlottedEngine(slots=2)
        proxy = LLMProxy(
            [engine],
            ProxyConfig(update_policy="drain"),
            slots_per_engine=2,
            clock=asyncio.get_running_loop().time,
        )
        calls = [asyncio.ensure_future(proxy.generate(make_request(f"r{i}"))) for i in range(10)]
        while len(engine.running) < 2:
            await asyncio.sleep(0)
        assert (len(engine.received), engine.waiting, proxy.stats()["num_held"]) == (2, 0, 8)
        await proxy.model_update({"w": 1}, version=1)
        await proxy.update_applied(1)
        generations = await asyncio.gather(*calls)
        assert engine.running_at_update == [0] and engine.queued_at_update == [0]
        versions = sorted(g.versions[0] for g in generations)
        assert versions == [0, 0] + [1] * 8 and all(len(set(g.versions)) == 1 for g in generations), versions
        proxy.close()

    for seed in range(4):
        run_shuffled(main, seed)
