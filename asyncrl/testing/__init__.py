"""Test tooling shipped with the package: a seeded shuffled (and virtual-time) event loop and a ledger.

The loop itself is the simulator's virtual clock (``asyncrl.sim.clock``), re-exported here for tests.

Tests of asyncrl's concurrent parts, and of user plugins, use these to explore interleavings reproducibly
and to check that every admitted sample ends exactly once and fresh.
"""

from asyncrl.sim.clock import (
    DeadlockError,
    ScheduleFailure,
    ShuffledEventLoop,
    run_seeds,
    run_shuffled,
)
from asyncrl.testing.fakes import make_group
from asyncrl.testing.ledger import Ledger, LedgerEntry, LedgerError, Outcome

__all__ = [
    "DeadlockError",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "Outcome",
    "ScheduleFailure",
    "ShuffledEventLoop",
    "make_group",
    "run_seeds",
    "run_shuffled",
]
