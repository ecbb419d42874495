"""Busy spans of a real run's workers, in the simulator's format, so one plotting code draws both.

Key decision: spans are written as they close to ``timeline.jsonl`` (one ``{"worker", "start", "end",
"kind"}`` object per line, seconds since the run's origin on the monotonic clock), flushed once per training
step, so a crashed run still leaves its timeline up to the last step. Workers are named as in the simulator:
``trainer`` (kinds ``train`` and ``update``: suspend → weight sync → resume), ``engine<i>`` (``generate``:
at least one request in flight), ``reward`` (``reward``: one scoring call; calls overlap when they run
concurrently).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

Spans = dict[str, list[list]]
"""worker → ``[start, end, kind]`` lists in start order, as ``sim.timeline.Timeline.spans`` holds them."""


class SpanRecorder:
    """Appends spans to ``path``; ``clock`` must be the clock the reporting parts read (monotonic here)."""

    def __init__(
        self, path: Path, *, append: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``append`` continues a resumed run's file: new spans start where the recorded ones ended, so the
        timeline reads as one run with the downtime cut out."""
        path.parent.mkdir(parents=True, exist_ok=True)
        already = _last_end(path) if append and path.is_file() else 0.0
        self._file = path.open("a" if append else "w", encoding="utf-8")
        self.clock = clock
        self.origin = clock() - already

    def add(self, worker: str, start: float, end: float, kind: str) -> None:
        """Record ``worker`` busy with ``kind`` over ``[start, end]`` (absolute times of ``clock``)."""
        if end <= start or self._file.closed:
            return
        record = {
            "worker": worker,
            "start": round(start - self.origin, 6),
            "end": round(end - self.origin, 6),
            "kind": kind,
        }
        self._file.write(json.dumps(record) + "\n")

    def engine_span(self, index: int, start: float, end: float) -> None:
        """The proxy's hook: engine ``index`` had requests in flight from ``start`` to ``end``."""
        self.add(f"engine{index}", start, end, "generate")

    def reward_span(self, elapsed_s: float) -> None:
        """The reward service's hook: a scoring call that took ``elapsed_s`` has just ended."""
        end = self.clock()
        self.add("reward", end - elapsed_s, end, "reward")

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        """Stop recording (later spans are dropped); closing twice is fine."""
        self._file.close()


def _last_end(path: Path) -> float:
    """The latest span end recorded in ``path`` (0 for an empty file)."""
    return max((end for items in read_spans(path).values() for _, end, _ in items), default=0.0)


def read_spans(path: str | Path) -> Spans:
    """The spans of a ``timeline.jsonl`` file by worker, each worker's in start order."""
    spans: Spans = defaultdict(list)
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                spans[record["worker"]].append([float(record["start"]), float(record["end"]), record["kind"]])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}: line {number}: not a timeline span ({err})") from err
    return {worker: sorted(items) for worker, items in spans.items()}


def write_spans(spans: Spans, path: str | Path) -> Path:
    """Write ``spans`` (times already relative to the run's origin) in the same format, e.g. a simulation's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for worker, items in spans.items():
            for start, end, kind in items:
                f.write(json.dumps({"worker": worker, "start": start, "end": end, "kind": kind}) + "\n")
    return path


def busy_fractions(spans: Spans, horizon_s: float) -> dict[str, float]:
    """Share of ``[0, horizon_s]`` each worker was busy (overlapping spans of one worker counted once)."""
    fractions = {}
    for worker, items in spans.items():
        busy, reach = 0.0, 0.0
        for start, end, _ in sorted(items):
            start = max(start, reach)
            if end > start:
                busy += end - start
                reach = end
        fractions[worker] = 0.0 if horizon_s <= 0 else min(1.0, busy / horizon_s)
    return fractions
