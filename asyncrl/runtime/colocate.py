"""Colocated sync with a switch (``runtime.switch``): the engines and the trainer take turns on one device.

::

    train_step:      engines sleep (KV pool freed) ─► trainer reloads its state ─► train
    state_for_sync:  publish (weight_sync colocated) ─► trainer offloads its state ─► engines wake
    (then the controller applies the update to the woken engines and the next rollout starts)

Key decision: the switch wraps the trainer facade the controller already calls (``LocalTrainer``), in the
order ``sync`` already runs its phases, so the controller, the proxy and the modes stay as they are; only
``sync`` is accepted (``RunConfig._check_switch``), the one mode whose engines are idle while it trains.

Each phase is timed and its bytes counted: ``colocate/{sleep,reload,sync,offload,wake}_s`` and ``_bytes``
join the step's trainer metrics, with what the engines' KV pools hold while the trainer trains
(``colocate/kv_pool_bytes_while_training``, 0 when they slept) and on CUDA the allocator's bytes then (the phases after training complete the step's metrics dict in
``state_for_sync``, which the controller runs before it reports the step), and the report's timeline shows
them as trainer spans (``app.train``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from asyncrl.config.runtime import SwitchConfig
from asyncrl.trainer.offload import OffloadChoice, StateOffloader
from asyncrl.types import Group
from asyncrl.weight_sync.protocol import WeightUpdate

T = TypeVar("T")

PHASES = ("sleep", "reload", "sync", "offload", "wake")
"""The switch's phases in the order a step runs them."""


class SwitchTimeout(TimeoutError):
    """An engine did not finish sleeping or waking within ``runtime.control_timeout_s``."""


class ColocatedTrainer:
    """The inline trainer facade (``runtime.inline.LocalTrainer``) with the engines in ``engines`` (the
    run's list, replaced engines included) sleeping while it trains and its state offloaded while they
    generate."""

    def __init__(self, local: Any, engines: list[Any], switch: SwitchConfig, timeout_s: float) -> None:
        self.local = local
        self.engines = engines
        self.switch = switch
        self.timeout_s = timeout_s
        self.offloader = StateOffloader.for_trainer(
            local.trainer,
            OffloadChoice(
                optimizer=switch.offload_optimizer,
                grads=switch.offload_grads,
                master_weights=switch.offload_master_weights,
            ),
        )
        self._asleep = False
        self._metrics: dict[str, float] = {}
        """The metrics dict of the last step, completed by ``state_for_sync``."""

    @property
    def trainer(self) -> Any:
        return self.local.trainer

    @property
    def step(self) -> int:
        return self.local.step

    @property
    def version(self) -> int:
        return self.local.version

    def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        """Sleep the engines, reload the trainer's state, train."""
        phases: dict[str, float] = {}
        self._timed(phases, "sleep", lambda: self._on_engines("sleep", self.switch.engine_sleep_level))
        self._asleep = True
        phases["colocate/kv_pool_bytes_while_training"] = float(
            sum(engine.stats().get("kv_pool_bytes", 0) for engine in self.engines)
        )
        self._timed(phases, "reload", lambda: self.local.on_training_thread(self.offloader.reload))
        phases |= _device_bytes(self.local.trainer.device)
        metrics = self.local.train_step(groups, policy_version)
        metrics.update(phases)
        self._metrics = metrics
        return metrics

    def state_for_sync(self) -> WeightUpdate:
        """Publish the weights, offload the trainer's state, wake the engines (which then apply the update)."""
        phases: dict[str, float] = {}
        update = self._timed(phases, "sync", self.local.state_for_sync, nbytes=_shipped)
        self._timed(phases, "offload", lambda: self.local.on_training_thread(self.offloader.offload))
        if self._asleep:  # not on a resume's first publish: the engines never slept
            self._timed(phases, "wake", lambda: self._on_engines("wake"))
            self._asleep = False
        self._metrics.update(phases)
        return update

    def on_training_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return self.local.on_training_thread(fn, *args)

    def save_checkpoint(self, root: str | Path, *, extra: dict[str, Any], keep_last: int | None) -> Path:
        return self.local.save_checkpoint(root, extra=extra, keep_last=keep_last)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Reload first: a loaded optimizer state lands on the device the parameters are on."""
        self.local.on_training_thread(self.offloader.reload)
        return self.local.load_checkpoint(path)

    def check_alive(self) -> None:
        self.local.check_alive()

    def shutdown(self) -> None:
        self.local.shutdown()

    def _timed(
        self,
        phases: dict[str, float],
        name: str,
        fn: Callable[[], T],
        nbytes: Callable[[T], int] = lambda moved: int(moved),  # type: ignore[arg-type]
    ) -> T:
        started = time.perf_counter()
        result = fn()
        phases[f"colocate/{name}_s"] = time.perf_counter() - started
        phases[f"colocate/{name}_bytes"] = float(nbytes(result))
        return result

    def _on_engines(self, call: str, *args: Any) -> int:
        """``engine.<call>(*args)`` on every engine at once, from this (non-loop) thread, within
        ``timeout_s``; the bytes they report, summed."""

        async def every() -> list[int]:
            return await asyncio.gather(*(getattr(engine, call)(*args) for engine in self.engines))

        async def bounded() -> list[int]:
            try:
                return await asyncio.wait_for(every(), self.timeout_s)
            except TimeoutError:
                raise SwitchTimeout(
                    f"engine {call} (colocated switch) did not finish within runtime.control_timeout_s="
                    f"{self.timeout_s} s"
                ) from None

        return sum(asyncio.run(bounded()))


def _device_bytes(device: Any) -> dict[str, float]:
    """The CUDA allocator's bytes in use as the trainer starts training (nothing to read on CPU)."""
    if device.type != "cuda":
        return {}
    import torch

    return {"colocate/device_allocated_bytes": float(torch.cuda.memory_allocated(device))}


def _shipped(update: WeightUpdate) -> int:
    return update.shipped_bytes or 0
