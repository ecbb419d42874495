"""A weight update is not an engine failure: an engine busy applying one (it answers nothing else meanwhile,
like a vLLM worker serving one command at a time) is left alone by the health patrol for as long as the
update's byte-sized deadline allows, and an engine that dies or wedges mid-update is still replaced, the run
going on with the update on its replacement. On the shuffled loop's virtual clock, under both update policies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import LLMProxy
from asyncrl.proxy.worker import EngineClient
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import EngineDied, FakeEngine, expected_tokens, make_request
from asyncrl.types import Generation, Request

PATROL_S = 10.0
"""The patrol's interval; every slow update below takes more than three of them."""
WEIGHTS = {"w": np.zeros(5, dtype=np.float32)}
"""20 bytes: at ``update_timeout_gbps`` 1e-9 (1 byte/s) its deadline is the floor + 20 s."""
DEADLINE = {"update_timeout_floor_s": 30.0, "update_timeout_gbps": 1e-9, "control_timeout_s": 5.0}
"""An update deadline of 50 s for ``WEIGHTS``, ten times the flat control deadline it replaces."""


def run(main: Callable[[], Awaitable[Any]], seed: int) -> Any:
    return run_shuffled(main, seed, virtual_time=True)


class BusyWhileUpdating(FakeEngine):
    """Answers no other control call (the patrol's probe included) while an update runs; ``die_in_update``:
    the engine dies that many seconds into its first update (every call then fails, as a killed actor's)."""

    def __init__(self, *, die_in_update: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.die_in_update = die_in_update
        self.dead = False
        self.probes = 0
        self._busy: asyncio.Lock | None = None

    def busy(self) -> asyncio.Lock:
        self._busy = self._busy or asyncio.Lock()
        return self._busy

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        async with self.busy():
            if self.dead:
                raise EngineDied("actor died")
            if self.die_in_update is not None:
                await asyncio.sleep(self.die_in_update)
                self.dead = True
                for run_ in list(self.running.values()):
                    self._fail(run_, EngineDied("actor died during a weight update"))
                raise EngineDied("actor died during a weight update")
            await super().update_weights(named_tensors, version)

    async def abort(self, request_id: str) -> Generation | None:
        async with self.busy():
            if self.dead:
                raise EngineDied("actor died")
            self.probes += request_id.startswith("asyncrl-health-probe")
            return await super().abort(request_id)

    async def generate(self, request: Request) -> Generation:
        if self.dead:
            raise EngineDied("actor died")
        return await super().generate(request)


def versions(engine: FakeEngine) -> list[int]:
    """The versions of the updates ``engine`` applied, in order."""
    return [version for version, _ in engine.updates]


class Factory:
    def __init__(self) -> None:
        self.started: list[FakeEngine] = []

    async def replace(self, index: int, failed: EngineClient) -> EngineClient:
        engine = FakeEngine(lengths=6, step_s=2.0)
        self.started.append(engine)
        return engine


def make_proxy(engines: list[FakeEngine], factory: Factory, policy: str) -> LLMProxy:
    config = ProxyConfig(
        update_policy=policy,
        health_check_interval_s=PATROL_S,
        health_check_timeout_s=5.0,
        **DEADLINE,
    )
    proxy = LLMProxy(engines, config, clock=asyncio.get_running_loop().time)
    proxy.enable_recovery(factory)
    return proxy


async def update(proxy: LLMProxy, version: int) -> None:
    """One weight update as the controller sends it under the proxy's policy."""
    if proxy.update_policy == "in_flight":
        await proxy.suspend()
        try:
            await proxy.model_update(WEIGHTS, version)
        finally:
            await proxy.resume()
    else:
        await proxy.model_update(WEIGHTS, version)
        await proxy.update_applied(version)


@pytest.mark.parametrize("policy", ["in_flight", "drain"])
def test_an_update_slower_than_three_patrols_completes_with_no_engine_replaced(policy):
    async def main() -> None:
        slow = BusyWhileUpdating(lengths=6, step_s=2.0, update_s=4.5 * PATROL_S)  # 45 s, deadline 50 s
        factory = Factory()
        proxy = make_proxy([slow], factory, policy)
        await asyncio.sleep(2.5 * PATROL_S)  # the patrol probes it twice before the update
        assert slow.probes == 2
        requests = [asyncio.ensure_future(proxy.generate(make_request(f"r{i}"))) for i in range(3)]
        await update(proxy, 1)
        generations = await asyncio.gather(*requests)
        after = await proxy.generate(make_request("after"))
        assert factory.started == [] and proxy.stats()["num_failed_probes"] == 0
        assert versions(slow) == [1] and proxy.healthy_engines() == [0]
        assert [g.token_ids for g in generations] == [expected_tokens(f"r{i}", 6)[0] for i in range(3)]
        assert after.versions == [1] * 6
        await asyncio.sleep(2 * PATROL_S)
        assert slow.probes >= 3  # patrolled again once the update was in
        await proxy.aclose()

    for seed in range(10):
        run(main, seed)


class SlowProbes(BusyWhileUpdating):
    """Takes ``probe_s`` before it looks at a probe, so an update can start while one is in flight."""

    def __init__(self, *, probe_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.probe_s = probe_s

    async def abort(self, request_id: str) -> Generation | None:
        if request_id.startswith("asyncrl-health-probe"):
            await asyncio.sleep(self.probe_s)
        return await super().abort(request_id)


@pytest.mark.parametrize("policy", ["in_flight", "drain"])
def test_a_probe_overlapped_by_an_update_is_not_counted_as_failed(policy):
    """The patrol forgives a probe that an update overlapped (the engine may answer nothing while it loads
    weights), so ``failed_probes``, which users read as probes held against an engine, must not count it."""

    async def main() -> None:
        engine = SlowProbes(probe_s=2.0, lengths=6, step_s=2.0, update_s=3 * PATROL_S)
        factory = Factory()
        proxy = make_proxy([engine], factory, policy)
        await asyncio.sleep(PATROL_S + 1.0)  # the first probe is in flight, answered at the earliest in 1 s
        await update(proxy, 1)  # it waits behind this update, past health_check_timeout_s
        assert factory.started == [] and engine.probes == 0
        assert proxy.stats()["num_failed_probes"] == 0
        await asyncio.sleep(2 * PATROL_S)
        assert engine.probes >= 1 and proxy.healthy_engines() == [0]
        await proxy.aclose()

    for seed in range(10):
        run(main, seed)


@pytest.mark.parametrize("policy", ["in_flight", "drain"])
@pytest.mark.parametrize("fault", ["killed", "wedged"])
def test_an_engine_killed_or_wedged_during_an_update_is_replaced_and_the_run_goes_on(policy, fault):
    """Killed: the update call fails at once. Wedged (the update never returns, probes unanswered): its
    deadline, sized by the update's bytes, finds it."""

    async def main() -> None:
        kwargs = {"die_in_update": 3 * PATROL_S} if fault == "killed" else {"update_s": 1e6}
        failing = BusyWhileUpdating(lengths=6, step_s=2.0, **kwargs)
        factory = Factory()
        proxy = make_proxy([failing], factory, policy)
        requests = [asyncio.ensure_future(proxy.generate(make_request(f"r{i}"))) for i in range(3)]
        await asyncio.sleep(1.0)
        started = asyncio.get_running_loop().time()
        await update(proxy, 1)
        elapsed = asyncio.get_running_loop().time() - started
        if fault == "wedged":  # found by the update's deadline (floor 30 s + 20 bytes at 1 byte/s)
            assert elapsed >= 50.0
        generations = await asyncio.gather(*requests)
        (fresh,) = factory.started
        assert versions(fresh) == [1] and proxy.stats()["num_engine_restarts"] == 1
        assert [g.token_ids for g in generations] == [expected_tokens(f"r{i}", 6)[0] for i in range(3)]
        await update(proxy, 2)  # the run goes on: the next update lands on the replacement
        assert versions(fresh) == [1, 2] and factory.started == [fresh]
        assert (await proxy.generate(make_request("after"))).versions == [2] * 6
        await proxy.aclose()

    for seed in range(10):
        run(main, seed)


def test_an_updates_deadline_grows_with_its_bytes():
    config = ProxyConfig(update_timeout_floor_s=120.0, update_timeout_gbps=0.2)
    assert config.update_timeout_s(0) == 120.0
    assert config.update_timeout_s(16_400_000_000) == pytest.approx(120.0 + 82.0)  # Qwen3-8B in bf16
    with pytest.raises(ValueError, match="proxy.update_timeout_gbps must be > 0"):
        ProxyConfig(update_timeout_gbps=0)
