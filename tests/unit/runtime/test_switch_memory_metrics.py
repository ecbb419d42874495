"""``runtime.colocate``'s per-step memory readings: on CUDA the caching allocator's bytes in use and held, its
retries and fragmentation, and the pinned host allocator's bytes and blocks, for the trainer's process and
summed over the engines that report theirs; on CPU absent, not zero. CUDA's allocators are fakes here. The host
buffers the trainer's offload keeps are read on CPU too."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from switch_fakes import IdleTrainer

from asyncrl.config.runtime import SwitchConfig
from asyncrl.runtime.colocate import MEMORY_READINGS, ColocatedTrainer, LocalState, device_memory

CUDA = {
    "memory_allocated": lambda device=None: 100,
    "memory_reserved": lambda device=None: 160,
    "memory_stats": lambda device=None: {"num_alloc_retries": 3, "inactive_split_bytes.all.current": 24},
    "host_memory_stats": lambda: {"allocated_bytes.current": 2**30, "num_host_alloc": 7},
}


def test_a_cuda_device_reads_every_allocator_figure(monkeypatch):
    for name, fake in CUDA.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    assert device_memory("cuda:0") == {
        "colocate/device_allocated_bytes": 100.0,
        "colocate/device_reserved_bytes": 160.0,
        "colocate/device_alloc_retries": 3.0,
        "colocate/device_inactive_split_bytes": 24.0,
        "colocate/host_pinned_bytes": float(2**30),
        "colocate/host_pinned_allocs": 7.0,
    }
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})  # no allocation yet
    assert device_memory("cuda", prefix="")["device_alloc_retries"] == 0.0


def test_on_cpu_the_readings_are_absent():
    assert device_memory("cpu") == {} and device_memory(torch.device("cpu"), prefix="") == {}


class Engine:
    """An engine whose stats carry its process's readings (an engine actor on CUDA) or none (on CPU)."""

    def __init__(self, readings: dict[str, float]) -> None:
        self.readings = readings

    async def sleep(self, level: int = 1) -> int:
        return 0

    async def wake(self) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        return {"kv_pool_bytes": 0, "num_sleeps": 1, "num_wakes": 0, "host_weight_bytes": 5, **self.readings}


class Trainer(IdleTrainer):
    def device_bytes(self) -> dict[str, float]:
        return device_memory("cuda:0")


@pytest.mark.parametrize("on_cuda", [True, False], ids=["cuda", "cpu"])
def test_a_step_reports_the_trainers_readings_and_the_engines_summed(monkeypatch, on_cuda):
    for name, fake in CUDA.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    readings = device_memory("cuda:0", prefix="") if on_cuda else {}
    trainer = Trainer()
    engines = [Engine(readings), Engine(readings)]
    switch = ColocatedTrainer(trainer, engines, SwitchConfig(enabled=True), timeout_s=5, state=trainer)
    metrics = switch.train_step([], 1)
    assert metrics["colocate/engine_host_weight_bytes"] == 10.0
    engine_keys = {f"colocate/engine_{reading}" for reading in MEMORY_READINGS}
    assert {f"colocate/{reading}" for reading in MEMORY_READINGS} <= metrics.keys()  # the trainer's
    if on_cuda:
        assert {key: metrics[key] for key in engine_keys} == {
            f"colocate/engine_{reading}": 2 * value for reading, value in readings.items()
        }
    else:
        assert not engine_keys & metrics.keys()


def test_the_inline_trainer_reports_its_offload_buffers_on_cpu_too():
    """``colocate/trainer_host_*``: the host buffers the trainer's offload keeps (``offload_memory``), 0 before
    its first offload, then the buffer's bytes and one allocation however many steps follow; none pinned on
    CPU."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    trainer = SimpleNamespace(model=model, optimizer=optimizer, device=torch.device("cpu"))
    state = LocalState(
        SimpleNamespace(trainer=trainer, on_training_thread=lambda fn, *a: fn(*a)), SwitchConfig()
    )
    keys = ("trainer_host_bytes", "trainer_host_pinned_bytes", "trainer_host_allocations")
    assert state.device_bytes() == {f"colocate/{key}": 0.0 for key in keys}
    for _ in range(2):
        moved = state.offload_state()
        state.reload_state()
    readings = state.device_bytes()
    assert readings["colocate/trainer_host_bytes"] >= moved > 0
    assert readings["colocate/trainer_host_pinned_bytes"] == 0.0
    assert readings["colocate/trainer_host_allocations"] == 1.0
