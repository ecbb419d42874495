"""EngineTally: the per-engine facts a proxy reads on every change, kept as running counts.

Why: ``MultiVersionProxy`` re-checks its gate, its partition and its sick engines after every change (a
request ending, a migration, an update), some hundred thousand times in a simulated run at DORA's size.
Scanning every engine each time made that O(engines) per request; here each fact is updated when one engine
changes (``update``: its load, health, readiness, version or arrivals), and re-read for all engines only
when the newest version moves (``rebuild``, once per weight update). Each aggregate equals the scan it
replaces (tests/unit/proxy/test_engine_tally.py compares them with the scans under random changes).
``LLMProxy`` reads only the gate's free slots (``gate_capacity``), over engines of any version (``newest``
None): every proxy bounds its held calls' wake-ups by the same count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from asyncrl.proxy.worker import EngineWorker


class EngineFacts(NamedTuple):
    """What one engine contributes to the tally (a tuple: built and compared on every load change)."""

    healthy: bool
    ready_version: int | None
    """Its version if it takes new work now (healthy, no control failure, ready), else None."""
    usable: bool
    """Healthy and no control call failed: it counts in the partition."""
    gate_slots: int | None
    """Free slots it offers the gate (healthy, ready, at the newest version or any if that is None;
    ``slots_per_engine`` minus its requests and arrivals, at least 0), None if it offers none. With no slot
    limit: 1 if it offers any."""
    sick: bool
    """Unhealthy, still answering (no control failure), with requests to evacuate."""


def facts_of(
    worker: EngineWorker, num_arriving: int, newest: int | None, slots_per_engine: int | None
) -> EngineFacts:
    """The facts of ``worker`` with ``num_arriving`` requests heading to it while ``newest`` is the newest
    (None: the gate takes every version)."""
    usable = worker.healthy and worker.control_error is None
    ready = worker.ready
    gate_slots = None
    if worker.healthy and ready and (newest is None or worker.version == newest):
        free = 1 if slots_per_engine is None else slots_per_engine - len(worker.in_flight) - num_arriving
        gate_slots = max(0, free)
    return EngineFacts(
        healthy=worker.healthy,
        ready_version=worker.version if usable and ready else None,
        usable=usable,
        gate_slots=gate_slots,
        sick=not worker.healthy and worker.control_error is None and bool(worker.in_flight),
    )


class EngineTally:
    """Running counts over engines: how many are healthy and usable, the ready ones per version, the gate's
    free slots at the newest version (or any), and the sick ones (see ``EngineFacts``)."""

    def __init__(self, num_engines: int, slots_per_engine: int | None) -> None:
        self.slots_per_engine = slots_per_engine
        self._facts: list[EngineFacts | None] = [None] * num_engines
        self.num_healthy = 0
        self.num_usable = 0
        self.ready_at: Counter[int] = Counter()
        """Ready usable engines per version (no zero counts)."""
        self.num_gate_engines = 0
        """Engines offering the gate slots (healthy, ready, at the newest version or any)."""
        self.gate_slots = 0
        """Free slots over those engines (with no slot limit: their number)."""
        self.sick: set[int] = set()

    def update(self, worker: EngineWorker, num_arriving: int, newest: int | None) -> None:
        """Engine ``worker`` may have changed: replace its contribution by its current facts. O(1)."""
        facts = facts_of(worker, num_arriving, newest, self.slots_per_engine)
        old = self._facts[worker.index]
        if facts == old:
            return
        if old is not None:
            self._count(worker.index, old, -1)
        self._facts[worker.index] = facts
        self._count(worker.index, facts, 1)

    def rebuild(
        self, workers: Sequence[EngineWorker], arriving: Mapping[int, int], newest: int | None
    ) -> None:
        """Every engine may have changed (the newest version moved): O(engines)."""
        for worker in workers:
            self.update(worker, arriving.get(worker.index, 0), newest)

    def gate_capacity(self, gate_open: bool) -> int | None:
        """How many held calls may leave a proxy's gate now, to bound how many a change wakes; None: all.

        Every call the gate lets go takes a free slot on a healthy, ready engine the gate counts, so this is
        never 0 when one could go (no wake-up is lost). None with no healthy engine (each call goes on, to
        ``NoHealthyEngine``) or no slot limit while some engine offers the gate a slot."""
        if not self.num_healthy:
            return None
        if not gate_open:
            return 0
        if self.slots_per_engine is None:
            return None if self.num_gate_engines else 0
        return self.gate_slots

    def _count(self, index: int, facts: EngineFacts, sign: int) -> None:
        self.num_healthy += sign * facts.healthy
        self.num_usable += sign * facts.usable
        if facts.ready_version is not None:
            self.ready_at[facts.ready_version] += sign
            if not self.ready_at[facts.ready_version]:
                del self.ready_at[facts.ready_version]
        if facts.gate_slots is not None:
            self.num_gate_engines += sign
            self.gate_slots += sign * facts.gate_slots
        if facts.sick:
            if sign > 0:
                self.sick.add(index)
            else:
                self.sick.discard(index)
