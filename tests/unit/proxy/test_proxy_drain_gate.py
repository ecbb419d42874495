"""LLMProxy's drain cap at scale: a freed slot wakes the held calls that can take a slot, not every held one.

A count, not a time. Under ``drain`` each engine takes at most ``slots_per_engine`` calls; the rest are held
at the proxy. Waking every held call whenever a slot frees (the broadcast this replaced) woke ~N²/slots of
them over a run (2 engines x 4 slots, 400 calls: 12.5 k wake-ups of 2-token calls, 20 k here); bounded by
the free slots, each call is woken about once. Run under shuffled schedules on a virtual clock, with weight
updates and aborts landing while most calls are held, checking that no call is lost and no engine ever runs
more than its slots.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.sim.clock import run_seeds
from asyncrl.testing.fake_engine import FakeEngine, make_request
from asyncrl.types import FinishReason, Generation, Request

NUM_ENGINES = 2
SLOTS_PER_ENGINE = 4


class SlotCountingEngine(FakeEngine):
    """A FakeEngine that records the most requests it ever ran at once."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.num_running = 0
        self.max_running = 0

    async def generate(self, request: Request) -> Generation:
        self.num_running += 1
        self.max_running = max(self.max_running, self.num_running)
        try:
            return await super().generate(request)
        finally:
            self.num_running -= 1


async def drain_scenario(seed: int, num_calls: int) -> None:
    """``num_calls`` calls of random lengths on 8 slots; updates and aborts while most of them are held."""
    rng = random.Random(seed)
    lengths = {f"r{i}": rng.randint(1, 4) for i in range(num_calls)}
    engines = [SlotCountingEngine(lengths=lengths, step_s=1.0) for _ in range(NUM_ENGINES)]
    proxy = LLMProxy(
        engines,
        ProxyConfig(update_policy="drain"),
        slots_per_engine=SLOTS_PER_ENGINE,
        clock=asyncio.get_running_loop().time,
    )
    calls = [
        asyncio.ensure_future(proxy.generate(make_request(request_id, max_new_tokens=8)))
        for request_id in lengths
    ]
    aborted = set(rng.sample(sorted(lengths), num_calls // 20))
    await asyncio.sleep(0.5)
    assert proxy.stats()["num_held"] >= num_calls - NUM_ENGINES * SLOTS_PER_ENGINE
    for version in (1, 2):
        await asyncio.sleep(rng.uniform(1.0, 10.0))
        await proxy.suspend()
        await proxy.model_update({"w": version}, version)
        await proxy.resume()
    for request_id in sorted(aborted):
        await proxy.abort(request_id)
    generations = await asyncio.wait_for(asyncio.gather(*calls), timeout=10.0 * num_calls)

    for request_id, generation in zip(lengths, generations, strict=True):
        if request_id not in aborted:
            assert generation.finish_reason is not FinishReason.ABORT, request_id
            assert len(generation.token_ids) == lengths[request_id], request_id
        assert len(set(generation.versions)) <= 1, request_id  # drain: one version per generation
    assert max(engine.max_running for engine in engines) <= SLOTS_PER_ENGINE
    stats = proxy.stats()
    assert stats["num_held"] == 0
    assert stats["num_gate_wakeups"] <= 2 * num_calls, stats["num_gate_wakeups"]
    await proxy.aclose()


@pytest.mark.parametrize("num_calls", [400, 800])
def test_a_freed_slot_wakes_only_as_many_held_calls_as_there_are_free_slots(num_calls: int) -> None:
    assert run_seeds(lambda seed: drain_scenario(seed, num_calls), seeds=range(3)) == 3
