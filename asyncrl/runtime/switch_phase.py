"""Which phase the switched engines are in (``runtime.switch``), so that an engine replaced meanwhile joins its
peers in it: one started while the trainer trains starts asleep, its KV pool (tens of GB at real shapes) never
allocated beside the trainer mid-step, and is woken with its peers at the next generation phase.

::

    switch:      enter(asleep=True) ─► sleep the engines listed then ─► train ─► enter(asleep=False) ─► wake them
    replacement: start_level() ─► start at that level (minutes: loading a model) ─► install(index, engine, level)
                                                                 in the list; brought to the phase now if it moved

Invariants (tests/unit/runtime/test_switch_phase.py, random schedules of a switch racing replacements): a
phase change and an install are atomic with respect to each other, so an engine is either in the list the
switch calls (the switch moves it) or joins after the change (``install`` moves it), never both (which would
sleep it twice) or neither; the switch waits (within its deadline) for an install still moving its engine
before it changes phase, so an engine started asleep is never woken while the trainer trains.
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
        """The sleep level a replacement starts at now: the switch's while the trainer trains, else 0."""
        with self._changed:
            return self.level if self.asleep else 0

    async def install(self, index: int, engine: Any, started: int) -> None:
        """Put ``engine`` (started at sleep level ``started``) in the list as engine ``index``, and move it to
        the phase its peers are in now if that changed since it started; a failed move is raised (the
        replacement failed)."""
        with self._changed:
            self.engines[index] = engine
            wanted = self.level if self.asleep else 0
            if wanted == started:
                return
            self._joining += 1
        try:
            move = engine.sleep(wanted) if wanted else engine.wake()
            await asyncio.wait_for(move, self.timeout_s)
        finally:
            with self._changed:
                self._joining -= 1
                self._changed.notify_all()
