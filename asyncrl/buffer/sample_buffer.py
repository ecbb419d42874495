"""SampleBuffer: finished groups tagged with their start version, bounded by the async ratio α.

Key decision: freshness is enforced twice. Admission control (a capacity rule on versions) keeps work from
being started that could not be trained fresh; a straggler that breaks the bound anyway is reclaimed, never
trained. ``get_batch(wait_for_older=True)`` (multi_version mode) goes further: it trains earliest deadline
first and waits for older groups still in flight, so no admitted group becomes a straggler at all. All
arithmetic lives in ``staleness``; this module only counts and waits. One asyncio loop, no threads: every
method that changes state runs to completion without awaiting, so no snapshot goes stale.

::

    producers                         SampleBuffer                              trainer
    ─────────                         ────────────                              ───────
    acquire_admission() ──ticket──►  in flight {ticket: version}
       (generate, reward, filter)        │
    put(ticket, group)  ────────────►  buffered (fresh, oldest first) ──get_batch(n)──► B groups
    release(ticket, filtered|aborted|failed) ─► dropped[kind]    stale ─► dropped[stale]
                                         ▲                                     │
                                         └──────── on_trainer_version(n+1) ◄───┘ (after train + weight sync)

Back-pressure:

=====================  ===============================================  ==========================================
waiter                 waits for                                        unblocked by
=====================  ===============================================  ==========================================
acquire_admission      trained + buffered + fresh in-flight < capacity  on_trainer_version (which also turns
                       ``(n + ⌊α⌋ + 1)·B + redundant``                  old in-flight groups stale), release,
                                                                        a stale put, close (else its timeout)
get_batch              ``num_groups`` fresh groups buffered; with       put, release, close (else its timeout)
                       ``wait_for_older``, also no older group in
                       flight that this batch would leave overdue
=====================  ===============================================  ==========================================

Every wait has a timeout whose error names the work still out (which producer holds which ticket, for how
long) and ``close()`` wakes every waiter with ``BufferClosedError``, so nothing hangs.

Invariants (asserted after every change):

* **Freshness** — every buffered group, hence every trained one, started at version ``>= n - ⌊α⌋``, where
  a group counts as started at the older of its ticket's version and its own ``start_version``.
* **Conservation** — ``admitted = trained + dropped(kind) + in flight + buffered``; a ticket ends once.
* **Bound** — at most ``(⌊α⌋ + 1)·B`` groups buffered (<= (1 + α)·B); admitted work within capacity.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from asyncrl import staleness
from asyncrl.buffer.records import Admission, BufferAccounting, DropKind, DroppedGroup
from asyncrl.config.buffer import BufferConfig
from asyncrl.types import Group

T = TypeVar("T")


class _Buffered(NamedTuple):
    """A buffered group with its training order (start version, then ticket) computed once, when it is put.

    Why: ``take_batch`` runs on every buffer change while the trainer waits (in multi_version mode each change
    re-tests ``wait_for_older``); recomputing a group's start version (a min over its trajectories) in every
    sort made that the simulator's largest cost at DORA's size. As a tuple led by the order, a list of these
    sorts natively, never comparing the admission or group."""

    start_version: int
    """``_start_version(admission, group)``: how old the group counts as."""
    ticket_id: int
    admission: Admission
    group: Group


class BufferClosedError(RuntimeError):
    """The buffer was closed; raised to every waiter and to any later admission or batch request."""


class BatchTimeoutError(TimeoutError):
    """``get_batch`` waited its timeout; the message names the producers whose groups have not arrived."""


class AdmissionTimeoutError(TimeoutError):
    """``acquire_admission`` waited its timeout; the message shows why capacity never opened."""


class SampleBuffer:
    """Bounded, version-aware store of finished groups between rollout producers and the trainer.

    ``groups_per_batch`` (B) is the number of groups one training step consumes and ``group_size`` the
    samples per group, so a batch is ``B·group_size`` samples. ``max_redundant_groups`` extra admissions
    let a producer over-start for dynamic filtering; what they add beyond the bound is dropped as surplus.
    """

    def __init__(
        self,
        config: BufferConfig,
        *,
        groups_per_batch: int,
        group_size: int,
        max_redundant_groups: int = 0,
        start_version: int = 0,
    ) -> None:
        """``start_version`` > 0 is a resumed run's trainer version: the B groups of each earlier version
        count as trained, so admission capacity (cumulative since version 0) opens exactly as far as an
        uninterrupted run's would, not ``start_version·B`` groups further."""
        if group_size < 1 or max_redundant_groups < 0:
            raise ValueError(
                f"group_size must be >= 1 and max_redundant_groups >= 0, got {group_size}, {max_redundant_groups}"
            )
        self.config = config
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.max_redundant_groups = max_redundant_groups
        self.max_buffered_groups = staleness.max_buffered_groups(config.async_ratio, groups_per_batch)
        self._version = 0
        self._trained_before = start_version * groups_per_batch
        self._in_flight: dict[int, Admission] = {}
        self._in_flight_versions: collections.Counter[int] = collections.Counter()
        """In-flight tickets per start version: counting the stale ones costs O(versions), not O(tickets)."""
        self._fresh_scan_threshold: int | None = None
        """The freshness threshold at which every buffered group was last checked (``_buffered_fresh``)."""
        self._buffered: list[_Buffered] = []
        self._dropped_log: list[DroppedGroup] = []
        self._counts: collections.Counter[str] = collections.Counter()
        self._dropped: collections.Counter[DropKind] = collections.Counter()
        self._min_fresh_version = 0
        self._batch_taken_at: int | None = None
        """The trainer version whose batch ``take_batch`` last took (see ``surplus_in_flight``)."""
        self._waiters: list[asyncio.Future[None]] = []
        self._num_admission_waiters = 0
        self._consumer_waiting = False
        self._closed_reason: str | None = None
        self.on_trainer_version(start_version)

    # ---- producers ---------------------------------------------------------------------------------

    def try_acquire_admission(self, producer: str, key: str = "") -> Admission | None:
        """A ticket to start one group now, or None when starting it could break the freshness bound."""
        self._raise_if_closed()
        if self._room() == 0:
            return None
        ticket = Admission(
            ticket_id=self._counts["admitted"],
            start_version=self._version,
            producer=producer,
            key=key,
            admitted_at=_now(),
        )
        self._counts["admitted"] += 1
        self._in_flight[ticket.ticket_id] = ticket
        self._in_flight_versions[ticket.start_version] += 1
        self._check_invariants()
        return ticket

    async def acquire_admission(
        self, producer: str, key: str = "", timeout_s: float | None = None
    ) -> Admission:
        """Wait until one more group may be started, then take its ticket (see the back-pressure table)."""
        timeout = self.config.admission_timeout_s if timeout_s is None else timeout_s
        self._num_admission_waiters += 1
        try:
            return await self._wait_until(
                lambda: self.try_acquire_admission(producer, key),
                timeout,
                lambda: AdmissionTimeoutError(self._describe_admission_timeout(producer, timeout)),
            )
        finally:
            self._num_admission_waiters -= 1

    def put(self, admission: Admission, group: Group) -> bool:
        """Hand in the finished group of ``admission``; False when it was dropped (stale, surplus, closed)."""
        if not 1 <= len(group) <= self.group_size:
            raise ValueError(
                f"group {group.prompt_uid!r} has {len(group)} samples, expected 1..{self.group_size}"
            )
        self._end_flight(admission)
        self._counts["put"] += 1
        kind, reason = self._rejection(admission, group)
        if kind is None:
            self._buffered.append(
                _Buffered(_start_version(admission, group), admission.ticket_id, admission, group)
            )
            self._counts["max_buffered"] = max(self._counts["max_buffered"], len(self._buffered))
        else:
            self._drop(admission, kind, reason, group)
        self._changed()
        return kind is None

    def release(self, admission: Admission, kind: DropKind, reason: str = "") -> None:
        """End ``admission`` without a trainable group (filtered, aborted or failed), returning its capacity."""
        if not kind.by_producer:
            raise ValueError(f"release kind must be filtered, aborted or failed, got {kind.value!r}")
        self._end_flight(admission)
        self._drop(admission, kind, reason)
        self._changed()

    def stale_in_flight(self) -> list[Admission]:
        """Tickets still generating that can no longer be trained: worth aborting, reclaimed when they report."""
        return [a for a in self._in_flight.values() if not self._is_fresh(a.start_version)]

    def surplus_in_flight(self) -> list[Admission]:
        """Tickets still generating whose last chance was the batch already taken at this version: fresh now,
        stale at the next version, so no batch can train them (redundant admissions once their batch is
        full). Worth aborting at once rather than after the training step."""
        if self._batch_taken_at != self._version:
            return []
        next_fresh = self._min_fresh_at_next_version()
        return [
            a
            for a in self._in_flight.values()
            if self._is_fresh(a.start_version) and a.start_version < next_fresh
        ]

    def untrainable_in_flight(self) -> list[Admission]:
        """``stale_in_flight`` and ``surplus_in_flight``: every ticket still generating that no batch can train."""
        return self.stale_in_flight() + self.surplus_in_flight()

    # ---- trainer -----------------------------------------------------------------------------------

    def on_trainer_version(self, version: int) -> list[DroppedGroup]:
        """The trainer (and the engines) moved to ``version``: reclaim stragglers and widen admission.

        Returns the buffered groups dropped as stale. Their producers already handed them in and will not
        hear of them again, so the caller ends their prompts (the controller does, in its prompt source).
        """
        if version < self._version:
            raise ValueError(f"trainer version went backwards: {self._version} -> {version}")
        if version == self._version:
            return []
        self._version = version
        self._min_fresh_version = staleness.min_fresh_version(version, self.config.async_ratio)
        stale = [entry for entry in self._buffered if not self._is_fresh(entry.start_version)]
        self._buffered = [entry for entry in self._buffered if self._is_fresh(entry.start_version)]
        dropped = [
            self._drop(e.admission, DropKind.STALE, self._stale_reason(e.admission, e.group), e.group)
            for e in stale
        ]
        self._changed()
        return dropped

    def take_batch(
        self, trainer_version: int, num_groups: int | None = None, *, wait_for_older: bool = False
    ) -> list[Group] | None:
        """The ``num_groups`` (default B) oldest fresh groups for the trainer at ``trainer_version``, or None.

        ``wait_for_older``: also None while taking them would leave an admitted group unable to be trained
        fresh and an older group still in flight could prevent that (see ``_must_wait_for_older``).
        """
        self._raise_if_closed()
        wanted = self._check_num_groups(num_groups)
        self.on_trainer_version(trainer_version)
        if len(self._buffered) < wanted:
            return None
        self._buffered.sort()  # by (start version, ticket): see ``_Buffered``
        if wait_for_older and self._must_wait_for_older(wanted):
            return None
        taken, self._buffered = self._buffered[:wanted], self._buffered[wanted:]
        self._batch_taken_at = self._version
        self._counts["trained"] += len(taken)
        self._counts["trained_samples"] += sum(len(entry.group) for entry in taken)
        self._changed()
        return [entry.group for entry in taken]

    async def get_batch(
        self,
        trainer_version: int,
        num_groups: int | None = None,
        timeout_s: float | None = None,
        *,
        wait_for_older: bool = False,
    ) -> list[Group]:
        """Wait for and take the oldest fresh batch; raises ``BatchTimeoutError`` naming what is stuck.

        ``wait_for_older=True`` (multi_version mode) trains no admitted group stale: the batch also waits
        for older in-flight groups that newer ones would otherwise push past their deadline.
        """
        wanted = self._check_num_groups(num_groups)
        timeout = self.config.get_batch_timeout_s if timeout_s is None else timeout_s
        if self._consumer_waiting:
            raise RuntimeError("get_batch is already waiting: the buffer serves one trainer")
        self._consumer_waiting = True
        try:
            return await self._wait_until(
                lambda: self.take_batch(trainer_version, wanted, wait_for_older=wait_for_older),
                timeout,
                lambda: BatchTimeoutError(self._describe_batch_timeout(trainer_version, wanted, timeout)),
            )
        finally:
            self._consumer_waiting = False

    # ---- checkpoints -------------------------------------------------------------------------------

    def snapshot(self) -> list[tuple[int, Group]]:
        """The buffered (finished, untrained) groups as ``(start version, group)``, in training order: what a
        checkpoint must keep so that a resumed run trains them instead of losing them."""
        return [(entry.start_version, entry.group) for entry in sorted(self._buffered)]

    def restore(self, groups: list[tuple[int, Group]], producer: str = "resume") -> list[Group]:
        """Re-admit a checkpoint's buffered groups at their start versions; the fresh ones are buffered, the
        ones the α bound no longer allows are dropped as stale (counted) and returned for regeneration."""
        stale = []
        for start_version, group in groups:
            ticket = Admission(
                ticket_id=self._counts["admitted"],
                start_version=start_version,
                producer=producer,
                key=group.prompt_uid,
                admitted_at=_now(),
            )
            self._counts["admitted"] += 1
            self._in_flight[ticket.ticket_id] = ticket
            self._in_flight_versions[ticket.start_version] += 1
            if not self.put(ticket, group):
                stale.append(group)
        return stale

    # ---- lifecycle and observation -----------------------------------------------------------------

    def close(self, reason: str = "closed") -> None:
        """Stop: buffered groups are dropped as closed and every waiter gets ``BufferClosedError``."""
        if self._closed_reason is not None:
            return
        self._closed_reason = reason
        buffered, self._buffered = self._buffered, []
        for entry in buffered:
            self._drop(entry.admission, DropKind.CLOSED, reason, entry.group)
        self._changed()

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    @property
    def version(self) -> int:
        return self._version

    def take_dropped(self) -> list[DroppedGroup]:
        """The drop records since the last call (for metrics and ledgers); counts stay in ``accounting()``."""
        dropped, self._dropped_log = self._dropped_log, []
        return dropped

    def accounting(self) -> BufferAccounting:
        """A consistent snapshot of every counter."""
        counts = self._counts
        return BufferAccounting(
            trainer_version=self._version,
            capacity=self._capacity(),
            num_admitted=counts["admitted"],
            num_put=counts["put"],
            num_trained=counts["trained"],
            num_in_flight=len(self._in_flight),
            num_stale_in_flight=len(self.stale_in_flight()),
            num_buffered=len(self._buffered),
            num_trained_samples=counts["trained_samples"],
            num_buffered_samples=sum(len(entry.group) for entry in self._buffered),
            max_buffered_seen=counts["max_buffered"],
            num_waiting_producers=self._num_admission_waiters,
            num_dropped={kind.value: count for kind, count in self._dropped.items()},
            in_flight_by_producer=dict(collections.Counter(a.producer for a in self._in_flight.values())),
        )

    # ---- internals ---------------------------------------------------------------------------------

    def _is_fresh(self, start_version: int) -> bool:
        """``staleness.is_fresh`` at the current version, with its threshold computed once per version."""
        return start_version >= self._min_fresh_version

    def _capacity(self) -> int:
        return staleness.admission_capacity(
            self._version, self.config.async_ratio, self.groups_per_batch, self.max_redundant_groups
        )

    def _num_live(self) -> int:
        """Groups holding capacity: buffered ones and in-flight ones that can still be trained."""
        num_stale = sum(n for version, n in self._in_flight_versions.items() if not self._is_fresh(version))
        return len(self._buffered) + len(self._in_flight) - num_stale

    def _room(self) -> int:
        """Groups that may start now. None once this version's batch is taken if a group started now would be
        stale at the next version (α < 1): nothing could train it, and a dropped surplus must not make room
        for work that is dropped in turn."""
        if self._batch_taken_at == self._version and self._min_fresh_at_next_version() > self._version:
            return 0
        trained = self._trained_before + self._counts["trained"]
        return staleness.num_admittable(self._capacity(), trained, self._num_live())

    def _min_fresh_at_next_version(self) -> int:
        return staleness.min_fresh_version(self._version + 1, self.config.async_ratio)

    def _must_wait_for_older(self, wanted: int) -> bool:
        """Whether the ``wanted`` oldest buffered groups (sorted) would leave some live group overdue while a
        group in flight, old enough to change that by arriving, is still out (``latest_overdue_version``).

        Without such a group waiting cannot help (only redundant admissions get there), so the batch goes.
        """
        alpha = self.config.async_ratio
        fresh_in_flight = {v: n for v, n in self._in_flight_versions.items() if self._is_fresh(v)}
        if not fresh_in_flight:
            return False
        left = collections.Counter(self._start_counts(wanted))
        left.update(fresh_in_flight)
        deadlines = {staleness.last_fresh_version(start, alpha): n for start, n in left.items()}
        overdue = staleness.latest_overdue_version_of_counts(
            deadlines, self._version, self.groups_per_batch, slack=self.max_redundant_groups
        )
        return overdue is not None and staleness.last_fresh_version(min(fresh_in_flight), alpha) <= overdue

    def _start_counts(self, skip: int) -> dict[int, int]:
        """How many of the buffered groups after the first ``skip`` (sorted) started at each version: one
        bisection per version, so the per-change test of ``wait_for_older`` is O(versions), not O(buffered)."""
        buffered, counts, i = self._buffered, {}, skip
        while i < len(buffered):
            version = buffered[i].start_version
            end = bisect.bisect_left(buffered, (version + 1,), lo=i)  # (v,) sorts before every (v, ...)
            counts[version], i = end - i, end
        return counts

    def _rejection(self, admission: Admission, group: Group) -> tuple[DropKind | None, str]:
        """Why a finished group cannot be buffered, or (None, "") when it can."""
        if self.closed:
            return DropKind.CLOSED, self._closed_reason or ""
        if not self._is_fresh(_start_version(admission, group)):
            return DropKind.STALE, self._stale_reason(admission, group)
        if len(self._buffered) >= self.max_buffered_groups:
            return DropKind.SURPLUS, f"buffer already holds {self.max_buffered_groups} groups"
        return None, ""

    def _stale_reason(self, admission: Admission, group: Group) -> str:
        started = _start_version(admission, group)
        return f"started at v{started}, trainer at v{self._version}, async_ratio {self.config.async_ratio}"

    def _end_flight(self, admission: Admission) -> None:
        ticket = self._in_flight.pop(admission.ticket_id, None)
        if ticket is None:
            raise ValueError(
                f"admission #{admission.ticket_id} ({admission.producer!r}, {admission.key!r}) is not in flight: "
                "it was already put or released"
            )
        self._in_flight_versions[ticket.start_version] -= 1
        if not self._in_flight_versions[ticket.start_version]:
            del self._in_flight_versions[ticket.start_version]

    def _drop(
        self, admission: Admission, kind: DropKind, reason: str, group: Group | None = None
    ) -> DroppedGroup:
        self._dropped[kind] += 1
        record = DroppedGroup(
            admission=admission, kind=kind, reason=reason, trainer_version=self._version, group=group
        )
        self._dropped_log.append(record)
        return record

    def _changed(self) -> None:
        """Check the invariants and wake every waiter to re-test its condition."""
        self._check_invariants()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _check_invariants(self) -> None:
        """Conservation, the bound, freshness and capacity; the snapshot is built only to explain a failure."""
        trained = self._counts["trained"]
        ended = trained + sum(self._dropped.values()) + len(self._in_flight) + len(self._buffered)
        ok = (
            ended == self._counts["admitted"]
            and len(self._buffered) <= self.max_buffered_groups
            and self._buffered_fresh()
            and self._trained_before + trained + self._num_live() <= self._capacity()
        )
        assert ok, f"SampleBuffer invariant broken: {self.accounting()}"

    def _buffered_fresh(self) -> bool:
        """Every buffered group is fresh. A buffered group turns stale only when the threshold moves, and
        groups join only at the end, one per ``put`` (each followed by a check): so all are scanned once per
        threshold and otherwise only the last one, keeping the check O(1) per event instead of O(buffered)."""
        if self._fresh_scan_threshold != self._min_fresh_version:
            self._fresh_scan_threshold = self._min_fresh_version
            return all(self._is_fresh(entry.start_version) for entry in self._buffered)
        return not self._buffered or self._is_fresh(self._buffered[-1].start_version)

    def _check_num_groups(self, num_groups: int | None) -> int:
        wanted = self.groups_per_batch if num_groups is None else num_groups
        if not 1 <= wanted <= self.max_buffered_groups:
            raise ValueError(
                f"num_groups must be in 1..{self.max_buffered_groups} (the buffer bound), got {wanted}"
            )
        return wanted

    def _raise_if_closed(self) -> None:
        if self._closed_reason is not None:
            raise BufferClosedError(f"sample buffer closed: {self._closed_reason}")

    async def _wait_until(
        self, attempt: Callable[[], T | None], timeout_s: float, timeout_error: Callable[[], Exception]
    ) -> T:
        """Retry ``attempt`` after every state change until it returns a value, the deadline or close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (result := attempt()) is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise timeout_error()
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait([waiter], timeout=remaining)  # on timeout: re-test once, then raise
            finally:
                waiter.cancel()  # no-op when it was woken; otherwise _changed skips it
        return result

    def _describe_batch_timeout(self, trainer_version: int, wanted: int, timeout_s: float) -> str:
        head = (
            f"get_batch({wanted} groups at version {trainer_version}) timed out after {timeout_s:g}s "
            f"with {len(self._buffered)} fresh groups buffered; "
        )
        if len(self._buffered) >= wanted:
            head += "waiting for older groups the batch may not overtake (wait_for_older); "
        if not self._in_flight and not self._num_admission_waiters:
            return (
                head + "no group is in flight and no producer is waiting for admission: is rollout running?"
            )
        return (
            head
            + self._describe_in_flight()
            + f"; {self._num_admission_waiters} producers waiting for admission"
        )

    def _describe_in_flight(self) -> str:
        now = _now()
        by_producer: dict[str, list[str]] = collections.defaultdict(list)
        for a in sorted(self._in_flight.values(), key=lambda a: a.ticket_id):
            stale = "" if self._is_fresh(a.start_version) else ", stale"
            by_producer[a.producer].append(
                f"#{a.ticket_id} {a.key!r} (v{a.start_version}, {now - a.admitted_at:.1f}s{stale})"
            )
        parts = [f"{producer!r}: {', '.join(items)}" for producer, items in by_producer.items()]
        return f"{len(self._in_flight)} admitted groups have not reported: " + "; ".join(parts)

    def _describe_admission_timeout(self, producer: str, timeout_s: float) -> str:
        return (
            f"producer {producer!r} got no admission in {timeout_s:g}s: trainer at version {self._version}, "
            f"capacity {self._capacity()} groups, {self._counts['trained']} trained + {len(self._buffered)} "
            f"buffered + {len(self._in_flight)} in flight; the trainer has not taken a batch or advanced its version"
        )


def _start_version(admission: Admission, group: Group) -> int:
    """How old a buffered group counts as: the older of its ticket's version (when its capacity was charged)
    and its own start version (the policy that began it), so a group never outlives the capacity it held."""
    return min(admission.start_version, group.start_version)


def _now() -> float:
    """The running loop's clock (virtual under test loops), or the monotonic clock outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
