"""``producer: external`` through a trainer restart: the trainer dies at step 2 (``TrainerDied``), the run
restarts from its step-1 checkpoint, and its endpoint comes back on the same URL (``serve.port: 0``, as the
agentic_endpoint recipe sets it); a trajectory the first attempt admitted gets 409 ``run_restarted`` from the
second; the example FrozenLake harness (only the ``openai`` client) plays through the restart, the run
finishes every step, and the harness ends cleanly once the run does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.controller.controller import Controller, StepRecord
from asyncrl.examples.agents import frozen_lake_harness
from asyncrl.rollout.endpoint_record import RESTARTED
from asyncrl.runtime.errors import TrainerDied

NUM_STEPS, BATCH, GROUP = 3, 2, 2
WAIT_S = 120.0
"""The deadline of every wait in the test (the run's get_batch, the harness's reconnect, the checker)."""


def test_a_trainer_restart_keeps_the_endpoint_and_the_harness_plays_through_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = load_run_config(
        None,
        [
            "producer=external",
            f"output_dir={out}",
            f"controller.num_steps={NUM_STEPS}",
            "controller.mode=async",
            "buffer.async_ratio=1",
            f"buffer.get_batch_timeout_s={WAIT_S}",
            f"rollout.rollout_batch_size={BATCH}",
            f"rollout.num_return_sequences={GROUP}",
            "trainer.checkpoint_every=1",
            "runtime.trainer_restarts=1",
            "serve.port=0",
            "serve.chat_format=plain",
            "model.device=cpu",
        ],
    )
    controllers: list[Controller] = []
    records: list[list[StepRecord]] = []
    checked = threading.Event()
    original_parts, original_controller = training.runtime_parts, training.assemble_controller
    original_metrics = training.step_metrics

    @contextlib.contextmanager
    def parts_whose_trainer_dies_at_step_2(run_config: Any) -> Iterator[Any]:
        with original_parts(run_config) as parts:
            trainer, first_attempt = parts.trainer, not records
            train_step = trainer.train_step
            records.append([])

            def step(groups: Any, version: int) -> Any:
                if first_attempt and trainer.step == 1:
                    raise TrainerDied("trainer: train_step(v1): the trainer is lost (injected by the test)")
                if not first_attempt:  # the run goes on only once the checker has called the endpoint
                    assert checked.wait(WAIT_S), "the checker did not finish"
                return train_step(groups, version)

            trainer.train_step = step
            yield parts

    def capture_controller(*args: Any, **kwargs: Any) -> Controller:
        controllers.append(original_controller(*args, **kwargs))
        return controllers[-1]

    def capture_record(record: StepRecord, *args: Any) -> dict[str, float]:
        records[-1].append(record)
        return original_metrics(record, *args)

    monkeypatch.setattr(training, "runtime_parts", parts_whose_trainer_dies_at_step_2)
    monkeypatch.setattr(training, "assemble_controller", capture_controller)
    monkeypatch.setattr(training, "step_metrics", capture_record)

    refusals: list[openai.APIError | BaseException] = []

    def check_an_old_trajectory() -> None:
        """Once the second attempt serves: continue a trajectory the first admitted, as its harness would."""
        try:
            deadline = time.monotonic() + WAIT_S
            while len(controllers) < 2 or controllers[1].producer.server.address is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the second attempt did not serve within {WAIT_S} s")
                time.sleep(0.05)
            first, second = (c.producer for c in controllers)
            old = next(iter(first._group_of))
            group = first._group_of[old].name
            client = openai.OpenAI(
                base_url=f"{second.server.url}/groups/{group}/trajectories/{old}/v1",
                api_key="-",
                max_retries=0,
                timeout=30,
            )
            messages = [
                {"role": "user", "content": "F..."},
                {"role": "assistant", "content": "right"},
                {"role": "user", "content": ".F.."},
            ]
            client.chat.completions.create(model="asyncrl-policy", messages=messages, max_tokens=4)
        except BaseException as error:  # deliberate: the main thread asserts on what came back
            refusals.append(error)
        finally:
            checked.set()

    harness_exit: list[int] = []
    harness = threading.Thread(
        target=lambda: harness_exit.append(
            asyncio.run(frozen_lake_harness.main(out, GROUP, 2, 4, 4, WAIT_S, WAIT_S))
        ),
        daemon=True,
    )
    checker = threading.Thread(target=check_an_old_trajectory, daemon=True)
    harness.start()
    checker.start()
    summary = asyncio.run(training.train(config, console=None))
    checker.join(WAIT_S)
    harness.join(WAIT_S)

    assert summary.steps == NUM_STEPS
    assert [[r.step for r in attempt] for attempt in records] == [[1], [2, 3]]
    first, second = (c.producer for c in controllers)
    assert first.server.url == second.server.url  # the URL a harness holds is still the run's
    (refusal,) = refusals
    assert isinstance(refusal, openai.ConflictError) and refusal.code == RESTARTED, refusal
    assert harness_exit == [0]  # it played through the restart and ended when the run did
    admitted_first = set(first._group_of)
    for record in records[1]:
        for group in record.groups:
            for t in group.trajectories:
                assert t.info["trajectory_id"] not in admitted_first
                assert t.info["trajectory_id"] in second._group_of
                assert sum(t.loss_mask) > 0
    assert not (out / "endpoint.json").exists()  # the run ended: a harness reading it knows
