"""The test loop: seeded shuffling finds order-dependent bugs, virtual time is instant, deadlocks are caught."""

import asyncio
import sys
import threading
import time

import pytest

from asyncrl.testing import DeadlockError, ScheduleFailure, ShuffledEventLoop, run_seeds, run_shuffled


async def _start_order():
    order = []

    async def worker(name):
        order.append(name)

    await asyncio.gather(*(worker(name) for name in "abc"))
    return "".join(order)


def test_fifo_without_seed_and_every_order_with_seeds():
    assert {run_shuffled(_start_order, seed=None) for _ in range(20)} == {"abc"}
    orders = {run_shuffled(_start_order, seed=seed) for seed in range(60)}
    assert orders == {"abc", "acb", "bac", "bca", "cab", "cba"}


def test_same_seed_same_order():
    assert [run_shuffled(_start_order, seed=s) for s in range(10)] == [
        run_shuffled(_start_order, seed=s) for s in range(10)
    ]


async def _init_race(seed):
    """Buggy on purpose: the reader assumes the writer, created first, has run first."""
    state = {}

    async def writer():
        state["ready"] = True

    async def reader():
        assert state.get("ready"), "read before write"

    await asyncio.gather(writer(), reader())


def test_shuffling_exposes_an_ordering_bug_and_names_the_seed():
    run_shuffled(lambda: _init_race(0), seed=None)  # FIFO hides it
    with pytest.raises(
        ScheduleFailure, match=r"scenario failed under seed \d+: AssertionError: read before write"
    ):
        run_seeds(_init_race, range(50))


def test_virtual_time_jumps_to_the_next_timer():
    async def main():
        loop = asyncio.get_running_loop()
        woke = []

        async def sleeper(delay):
            await asyncio.sleep(delay)
            woke.append((delay, loop.time()))

        await asyncio.gather(*(sleeper(d) for d in (600.0, 1.5, 30.0)))
        return woke

    start = time.perf_counter()
    assert run_shuffled(main, seed=5) == [(1.5, 1.5), (30.0, 30.0), (600.0, 600.0)]
    assert time.perf_counter() - start < 1.0


def test_virtual_time_timeouts_fire_at_their_deadline():
    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.get_running_loop().create_future(), timeout=3600)
        return asyncio.get_running_loop().time()

    assert run_shuffled(main, seed=1) == 3600.0


def test_a_deadlock_raises_instead_of_hanging():
    async def main():
        first, second = asyncio.Event(), asyncio.Event()

        async def wait_then_set(wait_on, then_set):
            await wait_on.wait()
            then_set.set()

        await asyncio.gather(
            asyncio.create_task(wait_then_set(first, second), name="waits-first"),
            asyncio.create_task(wait_then_set(second, first), name="waits-second"),
        )

    with pytest.raises(DeadlockError, match="pending tasks: .*waits-first, waits-second"):
        run_shuffled(main, seed=0)


def test_threads_are_not_mistaken_for_a_deadlock():
    async def main():
        return await asyncio.get_running_loop().run_in_executor(None, lambda: time.sleep(0.01) or "done")

    assert run_shuffled(main, seed=2) == "done"
    assert run_shuffled(main, seed=2, virtual_time=False) == "done"


def test_real_time_mode_uses_the_wall_clock():
    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(0.02)
        return loop.time() - start

    assert run_shuffled(main, seed=3, virtual_time=False) >= 0.02


def test_leftover_tasks_are_cancelled():
    cancelled = []

    async def main():
        async def forever():
            try:
                await asyncio.sleep(1e9)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        asyncio.create_task(forever())
        await asyncio.sleep(1)

    run_shuffled(main, seed=4)
    assert cancelled == [True]


def test_loop_is_a_selector_loop_and_starts_at_time_zero():
    loop = ShuffledEventLoop(seed=1, virtual_time=True)
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
        assert loop.time() == 0.0
    finally:
        loop.close()


def test_no_callback_a_thread_schedules_is_lost_while_the_loop_shuffles():
    """``call_soon_threadsafe`` appends to the ready queue from another thread at any instant, also while the
    loop shuffles that queue; before, the shuffle copied the queue and cleared it, so a callback appended in
    between was dropped (a thread's wake-up lost for good: the loop then waited on it forever)."""
    calls, total = [0], 20_000

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def count() -> None:
            calls[0] += 1
            if calls[0] == total:
                done.set_result(None)

        def schedule() -> None:
            for _ in range(total):
                loop.call_soon_threadsafe(count)

        async def spin() -> None:  # keeps the ready queue busy, so the loop shuffles it every iteration
            while not stopped:
                await asyncio.sleep(0)

        stopped = False

        spinners = [asyncio.ensure_future(spin()) for _ in range(4)]
        thread = threading.Thread(target=schedule)
        thread.start()
        try:
            await asyncio.wait_for(asyncio.shield(done), 30.0)
        finally:
            stopped = True
            thread.join()
            await asyncio.gather(*spinners)

    switching = sys.getswitchinterval()
    sys.setswitchinterval(
        1e-6
    )  # the threads take turns as often as they can: in the window too, if there is one
    try:
        for seed in range(3):
            calls[0] = 0
            run_shuffled(main, seed, virtual_time=False)
            assert calls[0] == total, (seed, calls[0])
    finally:
        sys.setswitchinterval(switching)
