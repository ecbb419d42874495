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
"""

from __future__ import annotations

from collections.abc import Sequence
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
