"""SlotPool: first come first served, a cancelled waiter passes its slot on, waiters on other loops/threads."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from asyncrl.sandbox.pool import SlotPool


def test_slots_go_to_waiters_in_arrival_order():
    async def main() -> list[str]:
        pool = SlotPool(1)
        held = await pool.acquire()
        order: list[str] = []

        async def waiter(name: str) -> None:
            slot = await pool.acquire()
            order.append(name)
            pool.release(slot)

        tasks = [asyncio.ensure_future(waiter(name)) for name in "abc"]
        await asyncio.sleep(0)
        pool.release(held)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_a_cancelled_waiter_passes_its_slot_on():
    async def main() -> int:
        pool = SlotPool(1)
        held = await pool.acquire()
        first = asyncio.ensure_future(pool.acquire())
        second = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        pool.release(held)  # handed to `first`, which is cancelled before it runs
        first.cancel()
        return await asyncio.wait_for(second, 1.0)

    assert asyncio.run(main()) == 0


def test_waiters_on_other_threads_and_loops_get_released_slots():
    pool = SlotPool(2)
    got: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        async def use() -> None:
            slot = await pool.acquire()
            with lock:
                got.append(slot)
            await asyncio.sleep(0.01)
            pool.release(slot)

        async def main() -> None:
            await asyncio.wait_for(asyncio.gather(*(use() for _ in range(5))), 5.0)

        asyncio.run(main())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(got) == 15 and set(got) == {0, 1}


def test_a_waiter_cancelled_after_being_handed_a_slot_gives_it_back():
    async def main() -> int:
        pool = SlotPool(1)
        held = await pool.acquire()
        first = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        pool.release(held)
        await asyncio.sleep(0)  # the hand-over callback runs: `first` has its slot but has not resumed
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        return await asyncio.wait_for(pool.acquire(), 1.0)

    assert asyncio.run(main()) == 0
