"""A trainer facade that does nothing, for tests of ``runtime.colocate.ColocatedTrainer`` whose subject is the
switch's engine calls, not training."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class IdleTrainer:
    """The facade and its state, doing nothing: every call returns what a trainer with nothing to move would."""

    version = 1

    def train_step(self, groups: Any, policy_version: int) -> dict[str, float]:
        return {}

    def state_for_sync(self) -> Any:
        return SimpleNamespace(version=self.version, shipped_bytes=4)

    def offload_state(self) -> int:
        return 0

    def reload_state(self, reference: bool = True) -> int:
        return 0

    def device_bytes(self) -> dict[str, float]:
        return {}
