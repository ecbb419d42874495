"""Where a replacement under ``runtime.switch`` puts its weights as it starts: at ``engine_sleep_level`` 2 they
are loaded into host memory and stay there until its wake, on the inline path (``InlineEngineFactory``) and in
an engine actor (``EngineActor``, which loads the model itself); on a GPU the whole model would otherwise land
on the device beside the trainer's step. The meta device stands for the accelerator (a device that is not host
memory), and every model handed to an engine is checked for where its parameters are."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from asyncrl.config.engine import EngineConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.run import RunConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.models import loading
from asyncrl.runtime.inline import InlineEngineFactory
from asyncrl.runtime.switch_phase import SwitchPhase

DEVICE = torch.device("meta")
ENGINE = EngineConfig(max_running_requests=2, max_kv_tokens=64)


@pytest.fixture
def handed(monkeypatch) -> list[set[torch.device]]:
    """``model.device`` resolves to the accelerator's twin; every model handed to an engine is recorded (the
    devices of its parameters) and refused if any is already there."""
    monkeypatch.setattr(loading, "resolve_device", lambda device: DEVICE)
    seen: list[set[torch.device]] = []
    build = LLMEngine.__init__

    def checked(self, model, *args, **kwargs):
        seen.append({p.device for p in model.parameters()})
        assert DEVICE not in seen[-1], "the replacement's weights were loaded onto the device before its wake"
        build(self, model, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "__init__", checked)
    return seen


def waiting_on_host(core: LLMEngine) -> bool:
    """Asleep at level 2 with every weight in host memory, serving on the device its wake moves them to."""
    on_host = all(p.device.type == "cpu" for p in core.model.parameters())
    return (
        core.asleep == 2 and on_host and core.runner.device == DEVICE and core.stats()["kv_pool_bytes"] == 0
    )


def test_an_inline_replacement_at_level_two_loads_its_weights_into_host_memory(handed):
    failed = SimpleNamespace(shutdown=lambda timeout: None)
    engines = [failed]
    phase = SwitchPhase(engines, level=2, timeout_s=5)
    phase.enter(asleep=True)  # the trainer trains: the replacement joins asleep, not woken
    factory = InlineEngineFactory(RunConfig(engine=ENGINE), engines, num_threads=1, phase=phase)
    engine = asyncio.run(factory.replace(0, failed))
    try:
        assert engines == [engine] and handed == [{torch.device("cpu")}]
        assert waiting_on_host(engine.core)
    finally:
        engine.shutdown()


def test_an_engine_actor_started_at_level_two_loads_its_weights_into_host_memory(handed):
    from asyncrl.runtime.ray_runtime import EngineActor

    actor = EngineActor(ModelConfig(), ENGINE, num_threads=1, asleep=2)
    try:
        assert handed == [{torch.device("cpu")}] and waiting_on_host(actor.engine.core)
    finally:
        actor.engine.shutdown()
