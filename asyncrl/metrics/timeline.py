"""Busy spans of every worker (simulated on the virtual clock, or real), for idle fractions and the Gantt chart.

Workers are named ``trainer``, ``engine<n>`` and ``env<n>``; ``metrics.plots`` orders the chart's rows by them.
"""

from __future__ import annotations

from collections import defaultdict

ENV_WORKER_PREFIX = "env"


def env_worker_name(index: int) -> str:
    """The timeline worker of the ``index``-th env instance of a run."""
    return f"{ENV_WORKER_PREFIX}{index}"


def is_env_worker(name: str) -> bool:
    """Whether a timeline worker is an env (``env<n>``; ``engine<n>`` is not)."""
    return name.startswith(ENV_WORKER_PREFIX) and name[len(ENV_WORKER_PREFIX) :].isdigit()


class Timeline:
    """``(start, end, kind)`` spans per worker; a span that starts where the last one of its kind ended
    extends it, so a worker kept busy by many segments stays one span. ``enabled=False`` records nothing
    but busy totals."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.spans: dict[str, list[list]] = defaultdict(list)
        self.busy_s: dict[str, float] = defaultdict(float)

    def add(self, worker: str, start: float, end: float, kind: str) -> None:
        """Record that ``worker`` did ``kind`` work from ``start`` to ``end``."""
        if end <= start:
            return
        self.busy_s[worker] += end - start
        if not self.enabled:
            return
        spans = self.spans[worker]
        if spans and spans[-1][2] == kind and abs(spans[-1][1] - start) < 1e-9:
            spans[-1][1] = end
        else:
            spans.append([start, end, kind])

    def busy_fraction(self, worker: str, horizon_s: float) -> float:
        """Share of ``[0, horizon_s]`` the worker spent busy."""
        return 0.0 if horizon_s <= 0 else min(1.0, self.busy_s[worker] / horizon_s)
