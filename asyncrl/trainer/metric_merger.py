"""Merging the metrics of a step's parts (micro-batches, mini-batches, ranks) into one record per step."""

from __future__ import annotations

from collections.abc import Iterable


class MetricMerger:
    """Combines per-part metrics: keys ending in ``_min``/``_max`` take the min/max, others a weighted mean."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}
        self._extremes: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for key, value in metrics.items():
            if key.endswith(("_min", "_max")):
                pick = min if key.endswith("_min") else max
                self._extremes[key] = pick(self._extremes.get(key, value), value)
            else:
                self._sums[key] = self._sums.get(key, 0.0) + weight * value
                self._weights[key] = self._weights.get(key, 0.0) + weight

    @classmethod
    def union(cls, parts: Iterable[MetricMerger]) -> MetricMerger:
        """One merger holding every part's sums, weights and extremes (e.g. one per rank)."""
        merged = cls()
        for part in parts:
            for key, value in part._sums.items():
                merged._sums[key] = merged._sums.get(key, 0.0) + value
                merged._weights[key] = merged._weights.get(key, 0.0) + part._weights[key]
            for key, value in part._extremes.items():
                pick = min if key.endswith("_min") else max
                merged._extremes[key] = pick(merged._extremes.get(key, value), value)
        return merged

    def result(self) -> dict[str, float]:
        means = {k: s / self._weights[k] if self._weights[k] > 0 else 0.0 for k, s in self._sums.items()}
        return {**means, **self._extremes}
