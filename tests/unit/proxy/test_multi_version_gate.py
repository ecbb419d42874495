"""The multi-version gate at scale: with 10 k calls held, a change wakes only the calls that can move.

A count, not a time: every ``notify`` of the gate wakes at most as many held calls as there are free engine
slots, and over the whole run each call is woken about once, where waking every held call on every change
(the broadcast gate this replaced) woke ~N²/slots of them.
"""

from __future__ import annotations

import asyncio

from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.proxy.wakeup import HeldCalls
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, make_request
from asyncrl.types import FinishReason

NUM_CALLS = 10_000
NUM_ENGINES = 4
SLOTS_PER_ENGINE = 4
NUM_SLOTS = NUM_ENGINES * SLOTS_PER_ENGINE


async def held_scenario() -> tuple[list[int], int, list, MultiVersionProxy]:
    """10 k calls on 16 slots; two weight updates while most of them are held at the gate."""
    engines = [FakeEngine(lengths=2, step_s=1.0) for _ in range(NUM_ENGINES)]
    proxy = MultiVersionProxy(
        engines,
        async_ratio=1.0,
        slots_per_engine=SLOTS_PER_ENGINE,
        clock=asyncio.get_running_loop().time,
    )
    woken_per_notify: list[int] = []
    held = proxy._held
    notify = held.notify

    def counted_notify(shared_condition: bool, limit: int | None = None) -> None:
        before = held.num_wakeups
        notify(shared_condition, limit)
        woken_per_notify.append(held.num_wakeups - before)

    held.notify = counted_notify  # type: ignore[method-assign]
    calls = [
        asyncio.ensure_future(proxy.generate(make_request(f"r{i}", max_new_tokens=2)))
        for i in range(NUM_CALLS)
    ]
    await asyncio.sleep(0.5)
    max_held = proxy.stats()["num_held"]
    for version in (1, 2):
        await proxy.suspend()
        await proxy.model_update({"w": version}, version)
        await proxy.resume()
        await asyncio.sleep(3.0)
    generations = await asyncio.gather(*calls)
    return woken_per_notify, max_held, generations, proxy


def test_a_change_wakes_at_most_the_free_slots_of_ten_thousand_held_calls() -> None:
    woken_per_notify, max_held, generations, proxy = run_shuffled(held_scenario, seed=3)
    assert max_held >= NUM_CALLS - NUM_SLOTS  # the gate really held ~10 k calls
    assert all(g.finish_reason is not FinishReason.ABORT for g in generations)
    assert max(woken_per_notify) <= NUM_SLOTS
    stats = proxy.stats()
    assert stats["num_gate_wakeups"] <= 2 * NUM_CALLS  # each call woken about once, not once per change
    assert all(len(set(g.versions)) == 1 for g in generations)  # one version per trajectory
    assert {g.versions[0] for g in generations} == {0, 1, 2}  # the updates landed while calls were held
    assert stats["max_versions_alive"] <= 2  # the window (α = 1) held throughout


def test_held_calls_wake_at_most_limit_pending_waiters_in_the_order_they_first_waited() -> None:
    async def scenario() -> list[str]:
        held = HeldCalls()
        state = {"open": False}
        order: list[str] = []

        async def waiter(key: str) -> None:
            await held.wait_until(key, lambda: state["open"], shared=True)
            order.append(key)

        tasks = [asyncio.ensure_future(waiter(k)) for k in "abcde"]
        await asyncio.sleep(0)
        held.notify(shared_condition=True, limit=2)  # a and b woken; "open" is False: they wait again
        held.notify(shared_condition=True, limit=2)  # a and b not re-checked yet: nobody more is woken
        assert held.num_wakeups == 2
        await asyncio.sleep(0)
        state["open"] = True
        held.notify(shared_condition=True, limit=3)  # a and b kept their place ahead of c
        await asyncio.sleep(0)
        assert order == ["a", "b", "c"] and len(held) == 2
        held.notify(shared_condition=True)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a", "b", "c", "d", "e"]
