"""The proxy caps each engine at the slots its backend runs (vLLM: ``engine.vllm.max_num_seqs``, not the
built-in engine's ``engine.max_running_requests``), and evaluation's share is of that same capacity.

Measured, not read off the proxy: more calls than slots go through the run's own ``make_proxy`` over fake
engines on virtual time, and each engine's running requests are counted before any of them emits a token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from asyncrl.app.runtimes import make_proxy
from asyncrl.config.base import ConfigError
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.controller.periodic_eval import periodic_evaluation
from asyncrl.data.base import TaskSample
from asyncrl.modes import async_ratio_for
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, make_request

NUM_ENGINES = 2
EXTRA_CALLS = 7
"""Calls beyond every engine's slots: they must wait at the proxy, not run on an engine."""
STEP_S = 1.0
"""A fake engine's time per token: counts are taken well inside the first step."""


@dataclass
class FakeParts:
    """What ``make_proxy`` reads of a runtime's parts."""

    config: RunConfig
    engines: list[Any]
    engine_factory: None = None


class EvalTask:
    """A task with an eval split, for ``periodic_evaluation``."""

    def split(self, name: str) -> list[TaskSample]:
        return [TaskSample(uid=f"{name}{i}", prompt="1+1=", answer="2") for i in range(4)]


def run_config(mode: str, *overrides: str) -> RunConfig:
    keys = [f"controller.mode={mode}", f"buffer.async_ratio={async_ratio_for(mode, 1.0)}"]
    keys += [f"rollout.num_engines={NUM_ENGINES}", "controller.eval_every=1"]
    return load_run_config(None, [*keys, *overrides])


def running_per_engine(config: RunConfig, num_calls: int, seed: int) -> list[int]:
    """Requests each engine runs at once while ``num_calls`` calls are sent through the run's proxy."""

    async def main() -> list[int]:
        engines = [FakeEngine(lengths=2, step_s=STEP_S) for _ in range(NUM_ENGINES)]
        proxy = make_proxy(FakeParts(config, engines))
        calls = [
            asyncio.ensure_future(proxy.generate(make_request(f"r{i}", max_new_tokens=2)))
            for i in range(num_calls)
        ]
        await asyncio.sleep(STEP_S / 4)  # virtual time: every call placed, none has a token yet
        running = [len(engine.running) for engine in engines]
        generations = await asyncio.gather(*calls)
        assert len(generations) == num_calls
        proxy.close()
        return running

    return run_shuffled(main, seed)


VLLM_256 = ("engine.backend=vllm", "engine.vllm.max_num_seqs=256")


@pytest.mark.parametrize("mode", ["multi_version", "async", "one_step_off", "sync"])
def test_a_vllm_engine_runs_its_max_num_seqs_at_once_not_the_built_in_engines_slots(mode: str) -> None:
    config = run_config(mode, *VLLM_256)
    running = running_per_engine(config, NUM_ENGINES * 256 + EXTRA_CALLS, seed=len(mode))
    assert running == [256] * NUM_ENGINES


@pytest.mark.parametrize("mode", ["multi_version", "async"])
def test_the_built_in_engine_keeps_its_max_running_requests(mode: str) -> None:
    config = run_config(mode, "engine.max_running_requests=5", "engine.vllm.max_num_seqs=256")
    assert running_per_engine(config, NUM_ENGINES * 5 + EXTRA_CALLS, seed=1) == [5] * NUM_ENGINES


def test_evaluation_holds_its_share_of_what_the_engines_really_run() -> None:
    """``controller.eval_share`` (a quarter) of the calls the engines run at once, so rollout keeps the rest."""
    config = run_config("async", *VLLM_256)
    capacity = sum(running_per_engine(config, NUM_ENGINES * 256 + EXTRA_CALLS, seed=2))
    evaluation = periodic_evaluation(config, proxy=None, tokenizer=None, task=EvalTask(), rewards=None)  # type: ignore[arg-type]
    assert evaluation is not None and config.controller.eval_share == 0.25
    assert evaluation.max_in_flight == capacity // 4 == NUM_ENGINES * 256 // 4


def test_max_num_seqs_through_engine_args_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.vllm\.engine_args\.max_num_seqs cannot be set"):
        load_run_config(None, ["engine.backend=vllm", "engine.vllm.engine_args={max_num_seqs: 128}"])
