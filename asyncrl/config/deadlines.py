"""Deadlines that scale with the bytes a call moves (an engine's weight update, a trainer checkpoint).

Key decision: one rule for every such deadline, a floor plus the bytes at a conservative bandwidth, so a large
model's legitimate transfer is never cut off by a deadline sized for a small one, while a call that truly
hangs still fails by name once it is past what even a slow link would take.
"""

from __future__ import annotations


def bytes_deadline_s(floor_s: float, gbps: float, nbytes: int) -> float:
    """Seconds a call moving ``nbytes`` may take: ``floor_s`` plus the bytes at ``gbps`` (GB/s, 1e9 bytes)."""
    return floor_s + nbytes / (gbps * 1e9)
