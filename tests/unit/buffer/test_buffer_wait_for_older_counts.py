"""``wait_for_older`` counted by version decides as the per-group scan it replaced, on random buffer states.

The buffer tests ``_must_wait_for_older`` on every change while the trainer waits, so it counts the groups
left after the batch and the fresh groups in flight by start version (O(versions)) instead of listing every
one. The reference below is the former per-group code, written out again; random admissions, puts (some
groups older than their ticket), batches and version moves reach states where the buffered groups decide the
answer, not only the ones in flight.
"""

from __future__ import annotations

import random

from asyncrl import staleness
from asyncrl.buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.testing import make_group

ALPHAS = (0, 0.5, 1, 2, 3)


def reference(buffer: SampleBuffer, wanted: int, *, ignore_buffered: bool = False) -> bool:
    """The per-group scan (``ignore_buffered``: as if no group were left buffered after the batch)."""
    alpha = buffer.config.async_ratio
    fresh_in_flight = [
        a.start_version for a in buffer._in_flight.values() if buffer._is_fresh(a.start_version)
    ]
    if not fresh_in_flight:
        return False
    left_buffered = [] if ignore_buffered else [e.start_version for e in buffer._buffered[wanted:]]
    deadlines = [staleness.last_fresh_version(s, alpha) for s in left_buffered + fresh_in_flight]
    overdue = staleness.latest_overdue_version(
        deadlines, buffer.version, buffer.groups_per_batch, slack=buffer.max_redundant_groups
    )
    return overdue is not None and staleness.last_fresh_version(min(fresh_in_flight), alpha) <= overdue


def test_counted_by_version_equals_the_per_group_scan() -> None:
    answers: set[bool] = set()
    decided_by_buffered = 0
    for seed in range(200):
        rng = random.Random(seed)
        batch = rng.randint(1, 4)
        buffer = SampleBuffer(
            BufferConfig(async_ratio=rng.choice(ALPHAS)),
            groups_per_batch=batch,
            group_size=2,
            max_redundant_groups=rng.randint(0, 2),
        )
        tickets = []
        for step in range(80):
            roll = rng.random()
            if roll < 0.45:
                ticket = buffer.try_acquire_admission("p", key=f"{seed}-{step}")
                if ticket is not None:
                    tickets.append(ticket)
            elif roll < 0.8 and tickets:
                ticket = tickets.pop(rng.randrange(len(tickets)))
                started = max(0, ticket.start_version - rng.choice((0, 0, 1)))
                buffer.put(ticket, make_group(ticket.key, started, 2))
            elif roll < 0.9:
                buffer.take_batch(buffer.version)
            else:
                buffer.on_trainer_version(buffer.version + 1)
            buffer._buffered.sort()  # as take_batch does before it asks
            for wanted in range(1, len(buffer._buffered) + 1):
                expected = reference(buffer, wanted)
                assert buffer._must_wait_for_older(wanted) == expected, (seed, step, wanted)
                answers.add(expected)
                decided_by_buffered += expected != reference(buffer, wanted, ignore_buffered=True)
    assert answers == {True, False}
    assert decided_by_buffered > 0  # states where the groups left buffered change the answer
