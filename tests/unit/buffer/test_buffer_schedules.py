"""Buffer invariants under randomized schedules: shuffled event loops over hundreds of seeds, and Hypothesis.

Fake producers take scripted long-tailed durations on a virtual clock, so each seed runs in about a
millisecond. Every run checks freshness, conservation, the buffer bound and termination.
"""

import asyncio
import math
import random
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from asyncrl.buffer import BufferClosedError, DropKind, SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.testing import Ledger, make_group, run_seeds, run_shuffled

ALPHAS = (0, 0.5, 1, 1.5, 2, 3)
GROUP_SIZE = 2
LONG_TAIL_S = (1.0, 1.0, 1.0, 2.0, 3.0, 5.0, 20.0)


@dataclass
class Run:
    """What one scenario observed."""

    alpha: float
    groups_per_batch: int
    ledger: Ledger = field(default_factory=Ledger)
    admitted: list[str] = field(default_factory=list)  # in ticket order: appended right after each grant
    admissions: list[tuple[int, int]] = field(default_factory=list)  # (start_version, groups trained then)
    batches: list[list[str]] = field(default_factory=list)


async def _producer(name, buffer, run, rng, drop_rate):
    for index in range(10_000):
        try:
            ticket = await buffer.acquire_admission(name, key=f"{name}-{index}", timeout_s=10_000)
        except BufferClosedError:
            return
        run.admitted.append(ticket.key)
        run.admissions.append((ticket.start_version, buffer.accounting().num_trained))
        await asyncio.sleep(rng.choice(LONG_TAIL_S))
        roll = rng.random()
        if roll < drop_rate:
            buffer.release(ticket, DropKind.FILTERED, "zero reward variance")
        elif roll < 1.5 * drop_rate:
            buffer.release(ticket, DropKind.FAILED, "reward service timeout")
        else:
            buffer.put(ticket, make_group(ticket.key, ticket.start_version, GROUP_SIZE))


async def _trainer(buffer, run, rng, num_steps, wait_for_older):
    for version in range(num_steps):
        batch = await buffer.get_batch(version, timeout_s=1_000, wait_for_older=wait_for_older)
        run.batches.append([g.prompt_uid for g in batch])
        for group in batch:
            run.ledger.record_trained(
                group.prompt_uid, start_version=group.start_version, trained_version=version
            )
        await asyncio.sleep(rng.uniform(0.5, 4.0))
        buffer.on_trainer_version(version + 1)


async def scenario(seed, alpha=None, drop_rate=0.1, num_steps=5, wait_for_older=False):
    rng = random.Random(seed)
    run = Run(
        alpha=ALPHAS[seed % len(ALPHAS)] if alpha is None else alpha, groups_per_batch=rng.randint(1, 3)
    )
    buffer = SampleBuffer(
        BufferConfig(async_ratio=run.alpha), groups_per_batch=run.groups_per_batch, group_size=GROUP_SIZE
    )
    producers = [
        asyncio.create_task(_producer(f"p{i}", buffer, run, rng, drop_rate)) for i in range(rng.randint(1, 4))
    ]
    await _trainer(buffer, run, rng, num_steps, wait_for_older)
    buffer.close("training finished")
    await asyncio.gather(*producers)
    run.ledger.record_buffer_drops(buffer.take_dropped())
    check_run(run, buffer, num_steps)
    return run


def check_run(run, buffer, num_steps):
    run.ledger.assert_complete(run.admitted)
    run.ledger.assert_fresh(run.alpha)
    accounting = buffer.accounting()
    assert accounting.is_balanced and accounting.num_in_flight == 0 and accounting.num_buffered == 0
    assert accounting.num_trained == num_steps * run.groups_per_batch
    bound_groups = (math.floor(run.alpha) + 1) * run.groups_per_batch
    assert accounting.max_buffered_seen <= bound_groups
    assert accounting.max_buffered_seen * GROUP_SIZE <= (1 + run.alpha) * run.groups_per_batch * GROUP_SIZE


def test_invariants_hold_over_500_shuffled_schedules():
    runs = []

    async def recorded(seed):
        runs.append(await scenario(seed))

    assert run_seeds(recorded, range(500)) == 500
    outcomes = [run.ledger.counts() for run in runs]
    # the sweep really exercises every ending: stragglers reclaimed, filtered, failed, closed mid-flight
    for outcome in ("trained", "reclaimed", "filtered", "failed", "aborted"):
        assert sum(o.get(outcome, 0) for o in outcomes) > 0, outcome


def test_waiting_for_older_groups_reclaims_none_over_500_shuffled_schedules():
    """``get_batch(wait_for_older=True)``: every α, batch size and drop pattern, and not one straggler."""
    runs = []

    async def recorded(seed):
        runs.append(await scenario(seed, wait_for_older=True))

    assert run_seeds(recorded, range(500)) == 500
    # the same seeds without waiting do reclaim stragglers (test_invariants_hold_over_500_shuffled_schedules)
    assert sum(run.ledger.counts().get("reclaimed", 0) for run in runs) == 0


def test_async_ratio_zero_is_strictly_synchronous():
    async def sync_scenario(seed):
        run = await scenario(seed, alpha=0, drop_rate=0.0)
        batch = run.groups_per_batch
        # every group of batch k was admitted at version k, and only after batch k-1 was taken
        assert all(trained == start * batch for start, trained in run.admissions)
        # so batch k is exactly the k-th block of admissions, in admission order, whatever finished first
        expected = [run.admitted[k * batch : (k + 1) * batch] for k in range(5)]
        assert run.batches == expected
        assert {(s, t) for s, t in run.ledger.trained_pairs()} == {(k, k) for k in range(5)}

    assert run_seeds(sync_scenario, range(200)) == 200


def test_seed_replays_the_same_schedule():
    first = run_shuffled(lambda: scenario(42), seed=42)
    second = run_shuffled(lambda: scenario(42), seed=42)
    assert first.batches == second.batches and first.ledger.entries() == second.ledger.entries()


class BufferMachine(RuleBasedStateMachine):
    """Hypothesis picks admissions, completions (fresh, late, filtered, failed), batches and version bumps."""

    @initialize(
        alpha=st.sampled_from(ALPHAS), groups_per_batch=st.integers(1, 3), redundant=st.integers(0, 2)
    )
    def setup(self, alpha, groups_per_batch, redundant):
        self.alpha = alpha
        self.buffer = SampleBuffer(
            BufferConfig(async_ratio=alpha),
            groups_per_batch=groups_per_batch,
            group_size=GROUP_SIZE,
            max_redundant_groups=redundant,
        )
        self.ledger = Ledger()
        self.in_flight = []
        self.admitted = []
        self.batch_taken_at = None

    @rule(producer=st.sampled_from(["a", "b"]))
    def admit(self, producer):
        ticket = self.buffer.try_acquire_admission(producer, key=f"g{len(self.admitted)}")
        accounting = self.buffer.accounting()
        if ticket is None:
            live = accounting.num_buffered + accounting.num_in_flight - accounting.num_stale_in_flight
            # with α < 1, a group started after this version's batch was taken could never be trained
            untrainable = self.alpha < 1 and self.batch_taken_at == self.buffer.version
            assert untrainable or accounting.num_trained + live >= accounting.capacity
        else:
            self.in_flight.append(ticket)
            self.admitted.append(ticket.key)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), outcome=st.sampled_from(["put", "put", "late", "filtered", "failed", "aborted"]))
    def finish(self, data, outcome):
        ticket = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        if outcome in ("put", "late"):
            start = max(0, ticket.start_version - (outcome == "late"))
            self.buffer.put(ticket, make_group(ticket.key, start, GROUP_SIZE))
        else:
            self.buffer.release(ticket, DropKind(outcome), f"{outcome} by the test")

    @rule(num_groups=st.integers(1, 3), wait_for_older=st.booleans())
    def take(self, num_groups, wait_for_older):
        wanted = min(num_groups, self.buffer.max_buffered_groups)
        batch = self.buffer.take_batch(self.buffer.version, wanted, wait_for_older=wait_for_older)
        if batch:
            self.batch_taken_at = self.buffer.version
        for group in batch or []:
            self.ledger.record_trained(
                group.prompt_uid, start_version=group.start_version, trained_version=self.buffer.version
            )

    @rule()
    def advance(self):
        self.buffer.on_trainer_version(self.buffer.version + 1)

    @invariant()
    def conserved_bounded_fresh(self):
        self.ledger.record_buffer_drops(self.buffer.take_dropped())
        accounting = self.buffer.accounting()
        assert accounting.is_balanced
        assert accounting.num_in_flight == len(self.in_flight)
        assert len(self.ledger.entries()) + accounting.num_in_flight + accounting.num_buffered == len(
            self.admitted
        )
        assert accounting.num_buffered <= (math.floor(self.alpha) + 1) * self.buffer.groups_per_batch
        self.ledger.assert_fresh(self.alpha)

    def teardown(self):
        self.buffer.close("end of example")
        for ticket in self.in_flight:
            self.buffer.put(ticket, make_group(ticket.key, ticket.start_version, GROUP_SIZE))
        self.ledger.record_buffer_drops(self.buffer.take_dropped())
        self.ledger.assert_complete(self.admitted)


BufferMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_buffer_state_machine = BufferMachine.TestCase
