"""Long-tailed item counts: most prompts ask for a few items, a few for many times more.

Key decision: a clipped log-normal, whose median and sigma are the two knobs users understand
("typically 3 items, occasionally 30"); the response length of every built-in task grows linearly with it.
"""

from __future__ import annotations

import math
import random


def long_tail_count(rng: random.Random, *, median: float, sigma: float, max_items: int) -> int:
    """One draw of ``round(median * exp(sigma * z))``, z ~ N(0, 1), clipped to [1, max_items]."""
    value = median * math.exp(sigma * rng.gauss(0.0, 1.0))
    return min(max(1, round(value)), max_items)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank rule (no interpolation)."""
    if not values:
        raise ValueError("quantile of an empty list")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]
