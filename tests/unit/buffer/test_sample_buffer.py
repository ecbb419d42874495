"""SampleBuffer: admission, freshness, reclaiming, accounting and waiting, with exact expected values."""

import asyncio

import pytest

from asyncrl.buffer import (
    AdmissionTimeoutError,
    BatchTimeoutError,
    BufferClosedError,
    DropKind,
    SampleBuffer,
)
from asyncrl.config.buffer import BufferConfig
from asyncrl.testing import make_group, run_shuffled


def make_buffer(alpha=0.0, groups_per_batch=2, group_size=2, redundant=0, **config):
    return SampleBuffer(
        BufferConfig(async_ratio=alpha, **config),
        groups_per_batch=groups_per_batch,
        group_size=group_size,
        max_redundant_groups=redundant,
    )


def admit(buffer, count, producer="p0"):
    tickets = [buffer.try_acquire_admission(producer, key=f"{producer}-{i}") for i in range(count)]
    assert all(t is not None for t in tickets)
    return tickets


def test_sync_admission_waits_for_the_next_version():
    buffer = make_buffer(alpha=0, groups_per_batch=2)
    first, second = admit(buffer, 2)
    assert buffer.try_acquire_admission("p0") is None  # capacity (0 + 0 + 1) * 2 = 2 is used
    buffer.put(second, make_group("b", 0))
    buffer.put(first, make_group("a", 0))
    batch = buffer.take_batch(0)
    assert [g.prompt_uid for g in batch] == ["a", "b"]  # oldest first: admission order, not arrival
    assert buffer.try_acquire_admission("p0") is None  # batch 0 taken, but version still 0
    buffer.on_trainer_version(1)
    tickets = admit(buffer, 2)
    assert [t.start_version for t in tickets] == [1, 1]
    assert buffer.try_acquire_admission("p0") is None


def test_async_ratio_one_admits_two_batches_ahead_and_accounts_exactly():
    buffer = make_buffer(alpha=1, groups_per_batch=2, group_size=3)
    tickets = admit(buffer, 4)
    assert buffer.try_acquire_admission("p0") is None
    for i, ticket in enumerate(tickets[:3]):
        assert buffer.put(ticket, make_group(f"g{i}", 0, group_size=3))
    acc = buffer.accounting()
    assert (acc.num_admitted, acc.num_put, acc.num_in_flight, acc.num_buffered) == (4, 3, 1, 3)
    assert (acc.capacity, acc.num_buffered_samples, acc.in_flight_by_producer) == (4, 9, {"p0": 1})
    assert len(buffer.take_batch(0)) == 2
    acc = buffer.accounting()
    assert (acc.num_trained, acc.num_trained_samples, acc.num_buffered, acc.max_buffered_seen) == (2, 6, 1, 3)
    assert acc.is_balanced


def test_in_flight_straggler_is_reclaimed_and_stops_holding_capacity():
    buffer = make_buffer(alpha=1, groups_per_batch=1)
    slow, quick = admit(buffer, 2)
    buffer.put(quick, make_group("quick", 0))
    assert [g.prompt_uid for g in buffer.take_batch(0)] == ["quick"]
    buffer.on_trainer_version(1)
    (next_one,) = admit(buffer, 1)
    buffer.put(next_one, make_group("next", 1))
    assert [g.prompt_uid for g in buffer.take_batch(1)] == ["next"]  # slow (v0) is still fresh at v1
    buffer.on_trainer_version(2)
    assert buffer.stale_in_flight() == [slow]
    acc = buffer.accounting()
    assert (acc.capacity, acc.num_trained, acc.num_stale_in_flight) == (4, 2, 1)
    assert len(admit(buffer, 2)) == 2  # the straggler's slot was returned
    assert buffer.put(slow, make_group("slow", 0)) is False
    (record,) = buffer.take_dropped()
    assert (record.kind, record.admission, record.trainer_version) == (DropKind.STALE, slow, 2)
    assert record.reason == "started at v0, trainer at v2, async_ratio 1"
    assert buffer.accounting().num_dropped == {"stale": 1}


def test_wait_for_older_holds_the_batch_until_an_older_group_cannot_be_overtaken():
    """α = 2, B = 1: taking the newer group at v1 would leave two v0 groups for the single batch at v2."""
    buffer = make_buffer(alpha=2, groups_per_batch=1)
    slow_a, slow_b, quick = admit(buffer, 3)
    buffer.put(quick, make_group("quick", 0))
    assert [g.prompt_uid for g in buffer.take_batch(0, wait_for_older=True)] == ["quick"]
    buffer.on_trainer_version(1)
    (newer,) = admit(buffer, 1)
    buffer.put(newer, make_group("newer", 1))
    assert buffer.take_batch(1, wait_for_older=True) is None
    buffer.put(slow_a, make_group("slow-a", 0))
    assert [g.prompt_uid for g in buffer.take_batch(1, wait_for_older=True)] == ["slow-a"]
    buffer.on_trainer_version(2)
    buffer.put(slow_b, make_group("slow-b", 0))
    assert [g.prompt_uid for g in buffer.take_batch(2, wait_for_older=True)] == ["slow-b"]
    assert buffer.accounting().num_dropped == {}


def test_a_batch_held_for_older_groups_says_so_when_it_times_out():
    async def main():
        buffer = make_buffer(alpha=1, groups_per_batch=1)
        slow, quick = admit(buffer, 2, producer="p")
        buffer.put(quick, make_group("quick", 0))
        buffer.take_batch(0)
        buffer.on_trainer_version(1)
        (newer,) = admit(buffer, 1, producer="p")
        buffer.put(newer, make_group("newer", 1))
        await buffer.get_batch(1, timeout_s=50, wait_for_older=True)

    with pytest.raises(BatchTimeoutError) as info:
        run_shuffled(main, seed=0)
    assert str(info.value).startswith(
        "get_batch(1 groups at version 1) timed out after 50s with 1 fresh groups buffered; waiting for older "
        "groups the batch may not overtake (wait_for_older); 1 admitted groups have not reported: 'p': #0 'p-0'"
    )


def test_without_wait_for_older_the_same_schedule_reclaims_a_straggler():
    buffer = make_buffer(alpha=2, groups_per_batch=1)
    slow_a, slow_b, quick = admit(buffer, 3)
    buffer.put(quick, make_group("quick", 0))
    buffer.take_batch(0)
    buffer.on_trainer_version(1)
    (newer,) = admit(buffer, 1)
    buffer.put(newer, make_group("newer", 1))
    assert [g.prompt_uid for g in buffer.take_batch(1)] == ["newer"]
    buffer.on_trainer_version(2)
    buffer.put(slow_a, make_group("slow-a", 0))
    buffer.take_batch(2)
    buffer.on_trainer_version(3)
    assert buffer.put(slow_b, make_group("slow-b", 0)) is False
    assert buffer.accounting().num_dropped == {"stale": 1}


def test_wait_for_older_does_not_wait_for_what_only_redundancy_overcommitted():
    """One redundant slot: three v0 groups for two batches; the third may be reclaimed, so no wait for it."""
    buffer = make_buffer(alpha=1, groups_per_batch=1, redundant=1)
    first, second, third = admit(buffer, 3)
    buffer.put(first, make_group("first", 0))
    assert [g.prompt_uid for g in buffer.take_batch(0, wait_for_older=True)] == ["first"]
    buffer.on_trainer_version(1)
    buffer.put(second, make_group("second", 0))
    assert [g.prompt_uid for g in buffer.take_batch(1, wait_for_older=True)] == ["second"]
    assert buffer.stale_in_flight() == []
    buffer.on_trainer_version(2)
    assert buffer.stale_in_flight() == [third]


def test_buffered_group_older_than_the_window_is_reclaimed_on_advance():
    buffer = make_buffer(alpha=0, groups_per_batch=1)
    (ticket,) = admit(buffer, 1)
    buffer.put(ticket, make_group("left-behind", 0))
    buffer.on_trainer_version(1)
    acc = buffer.accounting()
    assert (acc.num_buffered, acc.num_dropped, acc.capacity) == (0, {"stale": 1}, 2)
    assert len(admit(buffer, 2)) == 2


def test_group_started_before_its_ticket_counts_as_old_as_its_start():
    buffer = make_buffer(alpha=0, groups_per_batch=1)
    buffer.on_trainer_version(1)
    (ticket,) = admit(buffer, 1)
    assert buffer.put(ticket, make_group("old-weights", 0)) is False  # engines were still at v0
    assert buffer.accounting().num_dropped == {"stale": 1}


def test_release_returns_capacity_and_is_counted_by_kind():
    buffer = make_buffer(alpha=0, groups_per_batch=2)
    first, second = admit(buffer, 2)
    buffer.release(first, DropKind.FILTERED, "zero reward variance")
    buffer.release(second, DropKind.FAILED, "reward timeout")
    (third,) = admit(buffer, 1)
    assert third.ticket_id == 2
    acc = buffer.accounting()
    assert (acc.num_admitted, acc.num_in_flight, acc.num_dropped) == (3, 1, {"filtered": 1, "failed": 1})
    assert [(d.kind, d.reason) for d in buffer.take_dropped()] == [
        (DropKind.FILTERED, "zero reward variance"),
        (DropKind.FAILED, "reward timeout"),
    ]
    assert buffer.take_dropped() == []


def test_redundant_admissions_beyond_the_bound_are_dropped_as_surplus():
    buffer = make_buffer(alpha=0, groups_per_batch=1, redundant=1)
    first, second = admit(buffer, 2)
    assert buffer.try_acquire_admission("p0") is None
    assert buffer.put(first, make_group("a", 0))
    assert buffer.put(second, make_group("b", 0)) is False
    acc = buffer.accounting()
    assert (acc.num_buffered, acc.num_dropped, acc.max_buffered_seen) == (1, {"surplus": 1}, 1)


def test_misuse_is_rejected_with_a_clear_error():
    buffer = make_buffer(alpha=0, groups_per_batch=2, group_size=2)
    (ticket,) = admit(buffer, 1)
    with pytest.raises(ValueError, match="release kind must be"):
        buffer.release(ticket, DropKind.STALE)
    with pytest.raises(ValueError, match="has 3 samples, expected 1..2"):
        buffer.put(ticket, make_group("big", 0, group_size=3))
    buffer.put(ticket, make_group("a", 0))
    with pytest.raises(ValueError, match="is not in flight"):
        buffer.put(ticket, make_group("a", 0))
    with pytest.raises(ValueError, match="num_groups must be in 1..2"):
        buffer.take_batch(0, num_groups=3)
    buffer.on_trainer_version(2)
    with pytest.raises(ValueError, match="went backwards: 2 -> 1"):
        buffer.on_trainer_version(1)
    assert buffer.accounting().is_balanced


def test_close_drops_buffered_groups_and_later_puts():
    buffer = make_buffer(alpha=1, groups_per_batch=1)
    first, second = admit(buffer, 2)
    buffer.put(first, make_group("a", 0))
    buffer.close("shutting down")
    with pytest.raises(BufferClosedError, match="shutting down"):
        buffer.try_acquire_admission("p0")
    with pytest.raises(BufferClosedError):
        buffer.take_batch(0)
    assert buffer.put(second, make_group("b", 0)) is False
    acc = buffer.accounting()
    assert (acc.num_dropped, acc.num_in_flight, acc.num_buffered) == ({"closed": 2}, 0, 0)


def test_get_batch_waits_for_puts():
    async def main():
        buffer = make_buffer(alpha=0, groups_per_batch=2)
        tickets = admit(buffer, 2)

        async def produce(ticket, delay):
            await asyncio.sleep(delay)
            buffer.put(ticket, make_group(ticket.key, 0))

        tasks = [asyncio.create_task(produce(t, d)) for t, d in zip(tickets, (5.0, 1.0), strict=True)]
        batch = await buffer.get_batch(0, timeout_s=10)
        await asyncio.gather(*tasks)
        return [g.prompt_uid for g in batch], asyncio.get_running_loop().time()

    assert run_shuffled(main, seed=3) == (["p0-0", "p0-1"], 5.0)


def test_get_batch_timeout_names_the_stuck_producer():
    async def main():
        buffer = make_buffer(alpha=0, groups_per_batch=2)
        (done,) = admit(buffer, 1, producer="fast")
        admit(buffer, 1, producer="slow")
        buffer.put(done, make_group("a", 0))
        await asyncio.sleep(2.0)
        await buffer.get_batch(0, timeout_s=600)

    with pytest.raises(BatchTimeoutError) as info:
        run_shuffled(main, seed=0)
    message = str(info.value)
    assert "get_batch(2 groups at version 0) timed out after 600s with 1 fresh groups buffered" in message
    assert "1 admitted groups have not reported: 'slow': #1 'slow-0' (v0, 602.0s)" in message


def test_get_batch_timeout_without_any_rollout_says_so():
    async def main():
        await make_buffer().get_batch(0, timeout_s=1)

    with pytest.raises(BatchTimeoutError, match="no group is in flight and no producer is waiting"):
        run_shuffled(main, seed=0)


def test_acquire_admission_waits_for_the_version_and_times_out_clearly():
    async def main():
        buffer = make_buffer(alpha=0, groups_per_batch=1)
        (first,) = admit(buffer, 1)
        buffer.put(first, make_group("a", 0))
        waiter = asyncio.create_task(buffer.acquire_admission("p1", timeout_s=100))
        await asyncio.sleep(10)
        assert not waiter.done()
        assert len(buffer.take_batch(0)) == 1
        await asyncio.sleep(1)
        assert not waiter.done()  # batch taken, but admission waits for version 1
        buffer.on_trainer_version(1)
        ticket = await waiter
        assert (ticket.start_version, asyncio.get_running_loop().time()) == (1, 11.0)
        await buffer.acquire_admission("p2", timeout_s=30)

    with pytest.raises(
        AdmissionTimeoutError, match="producer 'p2' got no admission in 30s: trainer at version 1"
    ):
        run_shuffled(main, seed=1)


def test_close_wakes_every_waiter():
    async def main():
        buffer = make_buffer(alpha=0, groups_per_batch=1)
        admit(buffer, 1)
        consumer = asyncio.create_task(buffer.get_batch(0, timeout_s=1000))
        producer = asyncio.create_task(buffer.acquire_admission("p1", timeout_s=1000))
        await asyncio.sleep(1)
        buffer.close("trainer died")
        results = await asyncio.gather(consumer, producer, return_exceptions=True)
        return [type(r) for r in results], asyncio.get_running_loop().time()

    assert run_shuffled(main, seed=7) == ([BufferClosedError, BufferClosedError], 1.0)


def test_only_one_consumer_may_wait():
    async def main():
        buffer = make_buffer()
        first = asyncio.create_task(buffer.get_batch(0, timeout_s=5))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already waiting"):
            await buffer.get_batch(0)
        first.cancel()

    run_shuffled(main, seed=None)


def test_buffer_config_validation_names_the_key():
    with pytest.raises(ValueError, match=r"buffer.async_ratio must be a finite number >= 0, got -1"):
        BufferConfig(async_ratio=-1)
    with pytest.raises(ValueError, match=r"buffer.get_batch_timeout_s must be > 0, got 0"):
        BufferConfig(get_batch_timeout_s=0)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        SampleBuffer(BufferConfig(), groups_per_batch=1, group_size=0)


def test_redundant_groups_are_surplus_once_their_batch_is_taken_and_free_no_untrainable_room():
    buffer = make_buffer(alpha=0, groups_per_batch=1, redundant=1)
    first, second = admit(buffer, 2)
    buffer.put(first, make_group("first", 0))
    assert buffer.surplus_in_flight() == []  # the batch may still want it
    assert [g.prompt_uid for g in buffer.take_batch(0)] == ["first"]
    assert (buffer.surplus_in_flight(), buffer.stale_in_flight()) == ([second], [])
    assert buffer.untrainable_in_flight() == [second]
    buffer.release(second, DropKind.ABORTED, "surplus")
    assert buffer.try_acquire_admission("p0") is None  # started at v0 now, it would be stale at v1
    buffer.on_trainer_version(1)
    assert buffer.surplus_in_flight() == []
    assert len(admit(buffer, 2)) == 2


def test_with_one_step_of_lag_only_the_oldest_version_is_surplus():
    buffer = make_buffer(alpha=1, groups_per_batch=1, redundant=1)
    old, extra = admit(buffer, 2)
    buffer.put(old, make_group("old", 0))
    buffer.take_batch(0)
    assert buffer.surplus_in_flight() == []  # v0 is still fresh at v1
    buffer.on_trainer_version(1)
    (newer,) = admit(buffer, 1)
    buffer.put(newer, make_group("newer", 1))
    assert [g.prompt_uid for g in buffer.take_batch(1)] == ["newer"]
    assert buffer.surplus_in_flight() == [extra]  # v0's last chance was v1's batch
    assert buffer.try_acquire_admission("p0") is not None  # started at v1 it is fresh at v2
