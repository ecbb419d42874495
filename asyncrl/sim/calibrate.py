"""Fitting the simulator's cost models to measurements of a real run (``bench/sim_vs_real.py``).

Key decision: every fit is a closed-form least-squares fit of the cost model's own formula, so the fitted
parameters mean exactly what ``asyncrl.sim.cost`` does with them (no free shape the simulator cannot replay).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points, neither below 0.

    Why the constraint: a fixed cost or a cost per unit cannot be negative, and a few noisy points with little
    spread in ``xs`` (train steps of nearly equal size) can tilt the line either way. A negative slope gives
    the flat fit (the mean of ``ys``), a negative intercept the best line through the origin.
    """
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"fit_line needs as many xs as ys and at least one point, got {len(xs)}, {len(ys)}")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    if slope <= 0:
        return mean_y, 0.0
    intercept = mean_y - slope * mean_x
    if intercept < 0:
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return intercept, slope


def knee_factors(batches: Sequence[int], knee: int) -> list[float]:
    """The decode cost model's batch factor ``max(1, batch / knee)`` for each batch size."""
    return [max(1.0, batch / knee) for batch in batches]


def fit_decode_step(batches: Sequence[int], step_s: Sequence[float]) -> tuple[float, int]:
    """(decode_step_s, knee_batch) of ``decode_step_s · max(1, batch / knee_batch)`` fitting the points best.

    Each observed batch size is tried as the knee (the largest one means "flat over the whole range"); for a
    given knee the best ``decode_step_s`` is the closed form ``Σ f·t / Σ f²``.
    """
    if len(batches) != len(step_s) or not batches:
        raise ValueError(
            f"fit_decode_step needs as many batches as step times and at least one, got {len(batches)}, "
            f"{len(step_s)}"
        )
    best: tuple[float, float, int] | None = None
    for knee in sorted(set(batches)):
        factors = knee_factors(batches, knee)
        scale = sum(f * t for f, t in zip(factors, step_s, strict=True)) / sum(f * f for f in factors)
        error = sum((scale * f - t) ** 2 for f, t in zip(factors, step_s, strict=True))
        if best is None or error < best[0] - 1e-15:
            best = (error, scale, knee)
    assert best is not None
    return best[1], best[2]


def write_lengths_jsonl(lengths: Iterable[int], path: str | Path) -> Path:
    """Write lengths one per line, the format ``lengths.distribution: empirical`` reads."""
    path = Path(path)
    path.write_text("".join(json.dumps(int(length)) + "\n" for length in lengths))
    return path


def ratio_agreement(real_ratio: float, simulated_ratio: float) -> float:
    """Relative difference of the simulated ratio from the real one: ``|sim / real - 1|``."""
    if not real_ratio > 0:
        raise ValueError(f"real_ratio must be > 0, got {real_ratio}")
    return abs(simulated_ratio / real_ratio - 1)
