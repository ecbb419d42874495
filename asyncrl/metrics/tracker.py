"""Per-step metrics: every step appends one JSON object to ``metrics.jsonl`` and prints one console line.

Key decision: the JSONL file is the source of truth (plots, benchmarks and the run summary read it back); the
console line shows only the handful of numbers a person watches.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

CONSOLE_KEYS = ("reward/mean", "response_length/mean", "samples_per_s", "time/step_s", "staleness/max")


class MetricsTracker:
    """Appends per-step metrics to a JSONL file and echoes a short progress line."""

    def __init__(
        self, path: str | Path, *, total_steps: int, append: bool = False, console: TextIO | None = sys.stdout
    ) -> None:
        """``append`` continues an existing file (a resumed run); otherwise it is started afresh, so a rerun
        into the same directory never mixes two runs' records."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a" if append else "w", encoding="utf-8")
        self._total_steps = total_steps
        self._console = console

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._console is not None:
            shown = "  ".join(
                f"{k.split('/')[0] if k.endswith('/mean') else k}={_short(metrics[k])}"
                for k in CONSOLE_KEYS
                if k in metrics
            )
            print(f"[step {step}/{self._total_steps}] {shown}", file=self._console, flush=True)

    def close(self) -> None:
        self._file.close()


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


def _plain(value: float) -> float | int | str:
    return value if isinstance(value, (int, str)) else float(value)


def _short(value: float) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
