"""Which engine serves a request: least loaded, newest weights first, with prompt affinity (pure, no asyncio).

Key decision: the choice is one sort key over a snapshot of engine loads, so every decision is reproducible
from the snapshot and tested exactly. Order of preference, most important first:
1. *ready* engines (no weight update pending or being applied) before draining ones: a request routed to a
   draining engine would have to wait for its drain;
2. newer effective version (the version an engine serves once its pending update lands), so new work goes
   to the newest weights (the rule multi-version routing also needs);
3. fewer in-flight requests, then fewer in-flight tokens, then the lower engine index.
Affinity overrides 3 only: the engine that already serves a request's ``affinity_key`` wins if it ties with
the best on 1 and 2 and has at most ``affinity_slack`` more in-flight requests than the best.
A request pinned to a version (``Request.version``) only goes to engines whose effective version is that one.

``LeastLoadedRouting`` is the reference: it decides from a full snapshot (O(engines) per decision).
``LoadIndex`` makes the same decisions from loads kept ordered as they change (O(log engines) per decision),
which is what the proxy uses: it routes on every submission and re-checks held calls on every state change.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from asyncrl.config.proxy import ProxyConfig


@dataclass(frozen=True, kw_only=True)
class EngineLoad:
    """A snapshot of one engine as routing sees it."""

    index: int
    num_in_flight: int
    """Requests submitted to the engine that have not returned."""
    num_in_flight_tokens: int
    """KV the in-flight requests may occupy: prompt + max_new_tokens of each."""
    version: int
    """Effective version: the pending update's version if one is scheduled, else the served one."""
    ready: bool = True
    """No update pending or being applied: a request sent now starts at once."""
    healthy: bool = True


class RoutingPolicy(Protocol):
    """Chooses an engine index for a request, or None if no engine may serve it."""

    def choose(
        self,
        loads: Sequence[EngineLoad],
        *,
        affinity_owner: int | None = None,
        pinned_version: int | None = None,
        excluded: frozenset[int] = frozenset(),
    ) -> int | None: ...


class LeastLoadedRouting:
    """Least-loaded routing with prompt affinity and version pinning (rules in the module docstring)."""

    def __init__(self, affinity_slack: int) -> None:
        self.affinity_slack = affinity_slack

    def choose(
        self,
        loads: Sequence[EngineLoad],
        *,
        affinity_owner: int | None = None,
        pinned_version: int | None = None,
        excluded: frozenset[int] = frozenset(),
    ) -> int | None:
        candidates = [
            load
            for load in loads
            if load.healthy
            and load.index not in excluded
            and (pinned_version is None or load.version == pinned_version)
        ]
        if not candidates:
            return None
        best = min(candidates, key=_load_key)
        owner = next((load for load in candidates if load.index == affinity_owner), None)
        if owner is not None and self._owner_close_enough(owner, best):
            return owner.index
        return best.index

    def _owner_close_enough(self, owner: EngineLoad, best: EngineLoad) -> bool:
        same_class = _load_key(owner)[:2] == _load_key(best)[:2]
        return same_class and owner.num_in_flight <= best.num_in_flight + self.affinity_slack


def _load_key(load: EngineLoad) -> tuple[bool, int, int, int, int]:
    return (not load.ready, -load.version, load.num_in_flight, load.num_in_flight_tokens, load.index)


_Class = tuple[bool, int]
"""(not ready, -effective version): the part of the routing key affinity may not override."""
_Rank = tuple[int, int, int]
"""(in-flight requests, in-flight tokens, index): the rest of the key, ordering engines within a class."""


def _class_of(load: EngineLoad) -> _Class:
    return (not load.ready, -load.version)


def _rank_of(load: EngineLoad) -> _Rank:
    return (load.num_in_flight, load.num_in_flight_tokens, load.index)


class LoadIndex:
    """The current load of every engine, ordered by the routing key; ``choose`` equals
    ``LeastLoadedRouting.choose`` on the same loads.

    Engines are grouped by class (readiness, version: few distinct values at any time); each class is a heap of
    ranks. ``update`` pushes the engine's new rank and leaves its old entry in place: an entry is dropped when
    it reaches a heap's top and no longer matches the engine's current load (lazy invalidation). Heaps are
    rebuilt once stale entries outnumber engines, so memory stays O(engines) and ``update`` O(log engines)
    amortized. Unhealthy engines have no valid entry. Choices with engines excluded (retries after a failure,
    rare) fall back to the reference scan.
    """

    def __init__(self, loads: Iterable[EngineLoad], affinity_slack: int) -> None:
        self._reference = LeastLoadedRouting(affinity_slack)
        self._loads = {load.index: load for load in loads}
        self._classes: dict[_Class, list[_Rank]] = {}
        self._num_entries = 0
        self._rebuild()

    def update(self, load: EngineLoad) -> None:
        """Engine ``load.index`` now has this load."""
        self._loads[load.index] = load
        if not load.healthy:
            return
        heapq.heappush(self._classes.setdefault(_class_of(load), []), _rank_of(load))
        self._num_entries += 1
        if self._num_entries > 2 * len(self._loads) + 16:
            self._rebuild()

    def loads(self) -> list[EngineLoad]:
        """The current load of every engine, by index."""
        return [self._loads[index] for index in sorted(self._loads)]

    def choose(
        self,
        *,
        affinity_owner: int | None = None,
        pinned_version: int | None = None,
        excluded: frozenset[int] = frozenset(),
    ) -> int | None:
        """The engine ``LeastLoadedRouting.choose`` picks from the current loads, or None if none may serve."""
        if excluded:
            return self._reference.choose(
                self.loads(), affinity_owner=affinity_owner, pinned_version=pinned_version, excluded=excluded
            )
        best = self._best(pinned_version)
        if best is None:
            return None
        best_class, best_rank = best
        owner = self._loads.get(affinity_owner) if affinity_owner is not None else None
        if owner is not None and self._owner_close_enough(owner, best_class, best_rank, pinned_version):
            return owner.index
        return best_rank[2]

    def best_load(self, pinned_version: int | None = None) -> EngineLoad | None:
        """The least-loaded engine's load (no affinity, nothing excluded), or None if no engine may serve."""
        best = self._best(pinned_version)
        return None if best is None else self._loads[best[1][2]]

    def _best(self, pinned_version: int | None) -> tuple[_Class, _Rank] | None:
        if pinned_version is None:
            classes = sorted(self._classes)
        else:
            classes = [(False, -pinned_version), (True, -pinned_version)]
        for load_class in classes:
            top = self._top(load_class)
            if top is not None:
                return load_class, top
        return None

    def _top(self, load_class: _Class) -> _Rank | None:
        """The class's best current rank, popping stale entries; an emptied class is forgotten."""
        heap = self._classes.get(load_class)
        if heap is None:
            return None
        while heap and not self._is_current(load_class, heap[0]):
            heapq.heappop(heap)
            self._num_entries -= 1
        if not heap:
            del self._classes[load_class]
            return None
        return heap[0]

    def _is_current(self, load_class: _Class, rank: _Rank) -> bool:
        load = self._loads[rank[2]]
        return load.healthy and _class_of(load) == load_class and _rank_of(load) == rank

    def _owner_close_enough(
        self, owner: EngineLoad, best_class: _Class, best_rank: _Rank, pinned_version: int | None
    ) -> bool:
        pinned_ok = pinned_version is None or owner.version == pinned_version
        return (
            owner.healthy
            and pinned_ok
            and _class_of(owner) == best_class
            and owner.num_in_flight <= best_rank[0] + self._reference.affinity_slack
        )

    def _rebuild(self) -> None:
        self._classes = {}
        for load in self._loads.values():
            if load.healthy:
                self._classes.setdefault(_class_of(load), []).append(_rank_of(load))
        for heap in self._classes.values():
            heapq.heapify(heap)
        self._num_entries = sum(len(heap) for heap in self._classes.values())


def make_routing_policy(config: ProxyConfig) -> RoutingPolicy:
    """The routing policy of a proxy configured by ``config``."""
    return LeastLoadedRouting(affinity_slack=config.affinity_slack)


class AffinityTable:
    """Which engine owns each affinity key: the first engine a request with that key was sent to.

    A key is owned while its owner has requests with that key in flight (counted); it is forgotten when the
    count drops to zero, so the table stays as small as the set of keys in flight. Requests with the key that
    were routed elsewhere (owner too loaded) neither take nor extend ownership.
    """

    def __init__(self) -> None:
        self._owners: dict[str, tuple[int, int]] = {}

    def owner(self, key: str | None) -> int | None:
        if key is None or key not in self._owners:
            return None
        return self._owners[key][0]

    def add(self, key: str | None, engine_index: int) -> None:
        if key is None:
            return
        owner, count = self._owners.get(key, (engine_index, 0))
        if owner == engine_index:
            self._owners[key] = (owner, count + 1)

    def remove(self, key: str | None, engine_index: int) -> None:
        if key is None or self.owner(key) != engine_index:
            return
        owner, count = self._owners[key]
        if count <= 1:
            del self._owners[key]
        else:
            self._owners[key] = (owner, count - 1)

    def __len__(self) -> int:
        return len(self._owners)
