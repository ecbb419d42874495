"""The incremental routing index agrees with the reference rules; the worker keeps it current; targeted
wake-ups wake exactly the held calls whose wait may have ended."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from asyncrl.proxy.routing import EngineLoad, LeastLoadedRouting, LoadIndex
from asyncrl.proxy.wakeup import HeldCalls, Wakeup
from asyncrl.proxy.worker import EngineWorker, PendingUpdate
from asyncrl.types import Request, SamplingParams


def mk(index: int, num_in_flight: int = 0, tokens: int = 0, **kwargs: object) -> EngineLoad:
    fields = {"version": 0, "ready": True, "healthy": True, **kwargs}
    return EngineLoad(index=index, num_in_flight=num_in_flight, num_in_flight_tokens=tokens, **fields)  # type: ignore[arg-type]


def test_index_follows_updates_exactly():
    index = LoadIndex([mk(0, 2), mk(1, 1), mk(2, 1, 50)], affinity_slack=1)
    assert index.choose() == 1
    index.update(mk(1, 3))
    assert index.choose() == 2
    assert index.choose(affinity_owner=0) == 0  # 2 in flight <= 1 + slack 1
    index.update(mk(2, 0, version=1, ready=False))  # draining to v1: last, even though idle
    assert index.choose() == 0
    index.update(mk(0, healthy=False))
    index.update(mk(1, healthy=False))
    assert index.choose() == 2 and index.best_load() == mk(2, 0, version=1, ready=False)
    assert index.choose(pinned_version=0) is None
    index.update(mk(2, healthy=False))
    assert index.choose() is None and index.best_load() is None


def random_load(rng: random.Random, index: int) -> EngineLoad:
    return mk(
        index,
        rng.randint(0, 4),
        rng.choice([0, 100, 200]),
        version=rng.randint(0, 2),
        ready=rng.random() < 0.7,
        healthy=rng.random() < 0.9,
    )


@pytest.mark.parametrize("seed", range(20))
def test_index_agrees_with_reference_on_random_load_sequences(seed: int):
    rng = random.Random(seed)
    num_engines = rng.randint(1, 6)
    slack = rng.randint(0, 2)
    loads = [random_load(rng, i) for i in range(num_engines)]
    index = LoadIndex(loads, affinity_slack=slack)
    reference = LeastLoadedRouting(slack)
    for _ in range(300):  # many more updates than engines: the heaps are rebuilt along the way
        changed = random_load(rng, rng.randrange(num_engines))
        loads[changed.index] = changed
        index.update(changed)
        query = {
            "affinity_owner": rng.choice([None, *range(num_engines + 1)]),
            "pinned_version": rng.choice([None, 0, 1, 2, 3]),
            "excluded": frozenset(rng.sample(range(num_engines), rng.randint(0, 1))),
        }
        assert index.choose(**query) == reference.choose(loads, **query), (loads, query)
    assert index.loads() == loads


def test_worker_reports_every_change_of_its_load():
    seen: list[EngineLoad] = []
    worker = EngineWorker(index=3, client=None, version=0, started_at=0.0)  # type: ignore[arg-type]
    worker.on_load_change = lambda w: seen.append(w.load())
    request = Request(request_id="r", prompt_token_ids=[1, 2], sampling=SamplingParams(max_new_tokens=8))
    worker.start(7, request, now=0.0)
    worker.pending = PendingUpdate(named_tensors={}, version=1)
    worker.pending, worker.applying = None, 1
    worker.version, worker.applying = 1, None
    worker.finish(7, now=1.0)
    worker.record_failure(max_consecutive_failures=1)
    busy = mk(3, 1, 10)
    assert seen == [
        busy,
        replace(busy, version=1, ready=False),  # pending
        busy,  # pending cleared, applying not yet set
        replace(busy, version=1, ready=False),  # applying
        replace(busy, version=1, ready=False),  # applied, applying not yet cleared
        replace(busy, version=1),
        mk(3, version=1),  # finished
        mk(3, version=1, healthy=False),
    ]


def test_held_calls_wake_shared_waiters_only_when_the_shared_condition_holds():
    async def scenario() -> list[str]:
        held = HeldCalls()
        state = {"open": False, "pinned_ok": False}
        order: list[str] = []

        async def waiter(key: str, shared: bool) -> None:
            predicate = (lambda: state["open"]) if shared else (lambda: state["pinned_ok"])
            await held.wait_until(key, predicate, shared=shared)
            order.append(key)

        tasks = [asyncio.ensure_future(waiter(k, k != "pinned")) for k in ("a", "b", "pinned", "c")]
        await asyncio.sleep(0)
        assert len(held) == 4
        held.notify(shared_condition=False)
        await asyncio.sleep(0)
        assert order == [] and len(held) == 4
        state["pinned_ok"] = True
        held.notify(shared_condition=False)  # the own-predicate waiter is checked on every notify
        await asyncio.sleep(0)
        assert order == ["pinned"]
        held.notify(shared_condition=True)  # woken, but "open" is still False: they wait again
        await asyncio.sleep(0)
        assert order == ["pinned"] and len(held) == 3
        state["open"] = True
        held.wake("b")  # an abort wakes one call
        await asyncio.sleep(0)
        assert order == ["pinned", "b"]
        held.notify(shared_condition=True)
        await asyncio.gather(*tasks)
        assert len(held) == 0
        return order

    assert asyncio.run(scenario()) == ["pinned", "b", "a", "c"]


def test_held_call_cancelled_while_waiting_leaves_nothing_behind():
    async def scenario() -> int:
        held = HeldCalls()
        task = asyncio.ensure_future(held.wait_until("k", lambda: False, shared=True))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        held.wake("k")  # no longer waiting: a no-op
        return len(held)

    assert asyncio.run(scenario()) == 0


def test_broadcast_wakeup_rechecks_waiters_on_notify():
    async def scenario() -> bool:
        wakeup = Wakeup()
        flag = {"set": False}
        task = asyncio.ensure_future(wakeup.wait_until(lambda: flag["set"]))
        await asyncio.sleep(0)
        wakeup.notify()
        await asyncio.sleep(0)
        assert not task.done()
        flag["set"] = True
        wakeup.notify()
        await asyncio.wait_for(task, 1.0)
        wakeup.notify()  # no waiter: nothing to do
        return task.done()

    assert asyncio.run(scenario())
