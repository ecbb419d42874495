"""A ledger of terminal states: every admitted id ends exactly once, and every trained one ends fresh.

Tests of concurrent code record each sample's (or group's) end here as it happens. A second terminal state
for one id fails at once, where the bug is; ``assert_complete`` catches ids that never ended (lost work,
the "hang at 127/128" bug) and ``assert_fresh`` checks the async-ratio bound on every trained pair.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from asyncrl import staleness
from asyncrl.buffer.records import DropKind, DroppedGroup


class LedgerError(AssertionError):
    """A conservation or freshness violation found by the ledger."""


class Outcome(str, enum.Enum):
    """How an id ended. Only ``trained`` carries versions; every other outcome carries a reason."""

    TRAINED = "trained"
    FILTERED = "filtered"
    ABORTED = "aborted"
    FAILED = "failed"
    RECLAIMED = "reclaimed"


_OUTCOME_OF_DROP = {
    DropKind.FILTERED: Outcome.FILTERED,
    DropKind.ABORTED: Outcome.ABORTED,
    DropKind.FAILED: Outcome.FAILED,
    DropKind.STALE: Outcome.RECLAIMED,
    DropKind.SURPLUS: Outcome.ABORTED,
    DropKind.CLOSED: Outcome.ABORTED,
}


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """The terminal state of one id."""

    uid: str
    outcome: Outcome
    reason: str = ""
    start_version: int | None = None
    trained_version: int | None = None


class Ledger:
    """Exactly one terminal state per id, with (start_version, trained_version) for trained ones."""

    def __init__(self) -> None:
        self._entries: dict[str, LedgerEntry] = {}

    def record_trained(self, uid: str, *, start_version: int, trained_version: int) -> None:
        """``uid`` was trained by the trainer at ``trained_version``; it was started at ``start_version``."""
        entry = LedgerEntry(
            uid=uid, outcome=Outcome.TRAINED, start_version=start_version, trained_version=trained_version
        )
        self._record(entry)

    def record_dropped(self, uid: str, outcome: Outcome, reason: str) -> None:
        """``uid`` ended without training; the reason is mandatory (never silently lost)."""
        if outcome is Outcome.TRAINED:
            raise ValueError("use record_trained for trained ids")
        if not reason:
            raise ValueError(f"dropping {uid!r} as {outcome.value} needs a reason")
        self._record(LedgerEntry(uid=uid, outcome=outcome, reason=reason))

    def record_buffer_drops(self, dropped: Iterable[DroppedGroup]) -> None:
        """Record the SampleBuffer's drop records, keyed by each admission's ``key``."""
        for record in dropped:
            reason = f"{record.kind.value}: {record.reason}" if record.reason else record.kind.value
            self.record_dropped(record.admission.key, _OUTCOME_OF_DROP[record.kind], reason)

    def outcome_of(self, uid: str) -> Outcome | None:
        entry = self._entries.get(uid)
        return None if entry is None else entry.outcome

    def entries(self) -> list[LedgerEntry]:
        return list(self._entries.values())

    def counts(self) -> dict[str, int]:
        """How many ids ended in each outcome."""
        return dict(collections.Counter(entry.outcome.value for entry in self._entries.values()))

    def trained_pairs(self) -> list[tuple[int, int]]:
        """(start_version, trained_version) of every trained id, in recording order."""
        return [
            (e.start_version, e.trained_version)
            for e in self._entries.values()
            if e.start_version is not None and e.trained_version is not None
        ]

    def assert_complete(self, admitted_ids: Iterable[str]) -> None:
        """Every admitted id ended, and nothing ended that was never admitted."""
        admitted = set(admitted_ids)
        missing = sorted(admitted - self._entries.keys())
        unknown = sorted(self._entries.keys() - admitted)
        if missing or unknown:
            raise LedgerError(
                f"{len(missing)} admitted ids never ended {missing[:10]}; "
                f"{len(unknown)} ended ids were never admitted {unknown[:10]}"
            )

    def assert_fresh(self, async_ratio: float) -> None:
        """Every trained id was started at version >= trained version - α."""
        stale = [
            e
            for e in self._entries.values()
            if e.outcome is Outcome.TRAINED
            and not staleness.is_fresh(e.start_version, e.trained_version, async_ratio)
        ]
        if stale:
            pairs = [(e.uid, e.start_version, e.trained_version) for e in stale[:10]]
            raise LedgerError(f"{len(stale)} ids trained staler than async_ratio {async_ratio}: {pairs}")

    def _record(self, entry: LedgerEntry) -> None:
        previous = self._entries.get(entry.uid)
        if previous is not None:
            raise LedgerError(
                f"{entry.uid!r} ended twice: first {previous.outcome.value} ({previous.reason or previous.trained_version}), "
                f"then {entry.outcome.value} ({entry.reason or entry.trained_version})"
            )
        self._entries[entry.uid] = entry
