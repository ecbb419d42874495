"""The run's tracker: every step's metrics, the config and the summary, fanned out to the chosen sinks.

Key decision: the JSONL file is the source of truth (plots, benchmarks, ``asyncrl report`` and the run summary
read it back); the console, TensorBoard and W&B are views of the same records (``metrics/trackers.py``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from asyncrl.config.metrics import MetricsConfig
from asyncrl.metrics.trackers import make_trackers


class MetricsTracker:
    """Sends each record to every sink ``config.trackers`` names; ``path`` is the run's ``metrics.jsonl``."""

    def __init__(
        self,
        path: str | Path,
        *,
        total_steps: int,
        append: bool = False,
        console: TextIO | None = sys.stdout,
        config: MetricsConfig | None = None,
    ) -> None:
        self.path = Path(path)
        self._sinks = make_trackers(
            config or MetricsConfig(),
            self.path,
            total_steps=total_steps,
            append=append,
            console=console,
        )

    def log_config(self, config: Mapping[str, Any]) -> None:
        for sink in self._sinks:
            sink.log_config(config)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for sink in self._sinks:
            sink.log(step, metrics)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        for sink in self._sinks:
            sink.log_summary(summary)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The records of a metrics JSONL file, in order."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def length_stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p99 / max of ``values`` under ``prefix/`` (nearest-rank percentiles; empty → nothing)."""
    if not values:
        return {}
    ordered = sorted(values)
    return {
        f"{prefix}/mean": sum(ordered) / len(ordered),
        f"{prefix}/p50": _percentile(ordered, 50),
        f"{prefix}/p99": _percentile(ordered, 99),
        f"{prefix}/max": ordered[-1],
    }


def _percentile(ordered: Sequence[float], q: float) -> float:
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])
