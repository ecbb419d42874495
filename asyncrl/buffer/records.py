"""The records the SampleBuffer hands out: admission tickets, drop records and its accounting snapshot."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from asyncrl.types import Group


class DropKind(str, enum.Enum):
    """Why an admitted group left the buffer without being trained.

    Producers release with ``filtered`` (dynamic filtering), ``aborted`` (cut off, e.g. redundant once the
    batch is full) or ``failed`` (env, engine or reward error). The buffer itself drops with ``stale`` (a
    straggler reclaimed: it would break the freshness bound), ``surplus`` (the buffer already holds its
    bound) or ``closed`` (the buffer was closed before it could be trained).
    """

    FILTERED = "filtered"
    ABORTED = "aborted"
    FAILED = "failed"
    STALE = "stale"
    SURPLUS = "surplus"
    CLOSED = "closed"

    @property
    def by_producer(self) -> bool:
        """Whether producers may report this kind through ``SampleBuffer.release``."""
        return self in (DropKind.FILTERED, DropKind.ABORTED, DropKind.FAILED)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """A ticket to start generating one group, granted by ``SampleBuffer.acquire_admission``.

    Lifecycle: in flight → buffered (``put``) → trained | dropped(stale | closed); or in flight →
    dropped (``release``: filtered | aborted | failed; ``put``: stale | surplus | closed). Exactly one of
    ``put`` / ``release`` ends the in-flight state; a second one is an error.
    """

    ticket_id: int
    """Admission order; ties between groups of one start version are trained in this order."""
    start_version: int
    """The trainer version when the ticket was granted. Capacity is charged against it, and the group counts
    as started at the older of this and its own ``Group.start_version``."""
    producer: str
    """Who holds the ticket; named in timeout errors so a stuck producer is found."""
    key: str = ""
    """What is being generated (e.g. the prompt uid), for error messages and drop records."""
    admitted_at: float = 0.0
    """Loop time at admission; timeout errors report how long the ticket has been out."""


@dataclass(frozen=True, kw_only=True)
class DroppedGroup:
    """One admitted group that will never be trained, and why."""

    admission: Admission
    kind: DropKind
    reason: str
    trainer_version: int
    """The trainer version when it was dropped."""
    group: Group | None = None
    """The group, when it was produced (``put``) before being dropped."""


@dataclass(frozen=True, kw_only=True)
class BufferAccounting:
    """A snapshot of everything that entered and left the buffer; all counts are in groups unless named."""

    trainer_version: int
    capacity: int
    """Groups that may be admitted in total at this version (see ``staleness.admission_capacity``)."""
    num_admitted: int
    num_put: int
    num_trained: int
    num_in_flight: int
    num_stale_in_flight: int
    """In-flight groups already too old to train: reclaimed when they report; they no longer hold capacity."""
    num_buffered: int
    num_trained_samples: int
    num_buffered_samples: int
    max_buffered_seen: int
    """High-water mark of buffered groups since creation."""
    num_waiting_producers: int
    num_dropped: dict[str, int] = field(default_factory=dict)
    """Dropped groups by ``DropKind`` value."""
    in_flight_by_producer: dict[str, int] = field(default_factory=dict)

    @property
    def num_dropped_total(self) -> int:
        return sum(self.num_dropped.values())

    @property
    def is_balanced(self) -> bool:
        """Conservation: admitted = trained + dropped (by reason) + in flight + buffered."""
        accounted = self.num_trained + self.num_dropped_total + self.num_in_flight + self.num_buffered
        return self.num_admitted == accounted
