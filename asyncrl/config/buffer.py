"""Configuration of the SampleBuffer: the async ratio α and how long its waits may last."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class BufferConfig:
    """How far rollout may run ahead of training, and the timeouts that keep a stuck run from hanging.

    The batch size (groups per step) and group size belong to the rollout section; the controller passes
    them to the buffer.
    """

    async_ratio: float = 0.0
    """α: a sample trained at version n was started at version >= n - α. 0 is synchronous. Versions are
    integers, so only ⌊α⌋ matters (1.5 behaves as 1); see ``asyncrl.staleness``."""
    get_batch_timeout_s: float = 600.0
    """Longest ``get_batch`` waits for a full batch before raising a TimeoutError naming the stuck work."""
    admission_timeout_s: float = 3600.0
    """Longest a producer waits for admission (the trainer advancing) before raising a TimeoutError."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.async_ratio) or self.async_ratio < 0:
            raise ValueError(f"buffer.async_ratio must be a finite number >= 0, got {self.async_ratio}")
        for name in ("get_batch_timeout_s", "admission_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"buffer.{name} must be > 0, got {value}")
