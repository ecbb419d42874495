"""Which phase the switched engines are in (``runtime.switch``), so that an engine replaced meanwhile joins its
peers in it without ever taking the device's memory beside the trainer's step: every replacement starts asleep
at the switch's level, its KV pool (tens of GB at real shapes) never allocated at its start and, at level 2,
its weights loaded into host memory rather than onto the device; it is woken as it joins if its peers are awake
then, else with them at the next generation phase.

::

    switch:      enter(asleep=True) ─► sleep the engines listed then ─► train ─► enter(asleep=False) ─► wake them
    replacement: start_level() ─► start asleep at it (minutes: loading a model) ─► install(index, engine)
                                                          in the list; woken now if its peers are awake

Key decision: the level a replacement starts at does not depend on the phase. A start takes minutes and may
straddle the trainer's step start; one that read "awake" before it and allocated its pool after it would hold
the pool beside the trainer until ``install`` (after the step began) slept it again. Deciding at ``install``
instead, under the phase's lock, is the one point where the phase is known and held. The cost falls on a
replacement that joins awake peers: its pool is allocated at ``install`` rather than at its start (the same
bytes), and at level 2 its weights, loaded into pinned host memory, cross to the device at ``install`` rather
than at its load (the same one host-to-device copy, later; a switch about to change phase waits for it); not
measured (no GPU), and replacements are rare. At level 1 its weights load onto the device whatever the phase,
as its peers keep theirs there while the trainer trains.

Invariants (tests/unit/runtime/test_switch_phase.py, random schedules of a switch racing replacements, their
starts straddling phase changes): no replacement's KV pool is allocated while the trainer trains (none is at
its start; ``install`` wakes it only in the awake phase, which it holds until the wake ends); a phase change and an
install are atomic with respect to each other, so an engine is either in the list the switch calls (the switch
moves it) or joins after the change (``install`` moves it), never both (which would sleep it twice) or neither;
the switch waits (within its deadline) for an install still moving its engine before it changes phase, so no
engine is woken while the trainer trains. A checkpoint (``colocate.ColocatedTrainer.save_checkpoint``) changes
phase too, and like a step from a worker thread, off the event loop the installs run on, so it waits for them
the same way.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class SwitchPhaseTimeout(TimeoutError):
    """The switch waited past ``runtime.control_timeout_s`` for a replacement still joining its phase."""


class SwitchPhase:
    """The phase of the engines in ``engines`` (the run's list, replaced engines included): asleep at
    ``level`` while the trainer trains, awake otherwise; each move bounded by ``timeout_s``."""

    def __init__(self, engines: list[Any], level: int, timeout_s: float) -> None:
        self.engines = engines
        self.level = level
        self.timeout_s = timeout_s
        self.asleep = False
        """Whether the switch put its engines to sleep (from its ``sleep`` until its ``wake``)."""
        self._changed = threading.Condition()
        self._joining = 0
        """Installs moving their engine to the phase now: the switch changes phase only once none is."""

    def enter(self, asleep: bool) -> list[Any]:
        """The switch moves to its training phase (``asleep``) or back: the engines it must move itself (those
        listed now; one installed later is moved by its ``install``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._joining == 0, self.timeout_s):
                raise SwitchPhaseTimeout(
                    f"the colocated switch waited runtime.control_timeout_s={self.timeout_s} s for a replaced "
                    "engine to join its peers' phase"
                )
            self.asleep = asleep
            return list(self.engines)

    def start_level(self) -> int:
        """The sleep level a replacement starts at: the switch's, whatever the phase now (module docstring:
        its start may straddle a phase change; ``install`` wakes it if its peers are awake as it joins)."""
        return self.level

    async def install(self, index: int, engine: Any) -> None:
        """Put ``engine`` (a replacement, started asleep at ``start_level()``) in the list as engine ``index``,
        and wake it if its peers are awake now (else the switch wakes it with them); a failed wake is raised
        (the replacement failed)."""
        with self._changed:
            self.engines[index] = engine
            if self.asleep:
                return
            self._joining += 1
        try:
            await asyncio.wait_for(engine.wake(), self.timeout_s)
        finally:
            with self._changed:
                self._joining -= 1
                self._changed.notify_all()
