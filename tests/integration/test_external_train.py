"""``producer: external``: a training run serves the endpoint; a harness written only against the ``openai``
client plays a copying game through it and posts rewards; the run trains on exactly those trajectories.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import openai

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.controller.controller import Controller, StepRecord

NUM_STEPS, BATCH, GROUP = 2, 2, 2


def harness(out: Path, stop: threading.Event, played: list[tuple[str, float]]) -> None:
    """Play groups of GROUP two-turn episodes until the run stops answering."""
    endpoint = out / "endpoint.json"
    while not endpoint.exists() and not stop.is_set():
        time.sleep(0.02)
    url = json.loads(endpoint.read_text())["url"].removesuffix("/v1")
    game = 0
    while not stop.is_set():
        game += 1
        for member in range(GROUP):
            trajectory = f"g{game}-{member}"
            client = openai.OpenAI(
                base_url=f"{url}/groups/g{game}/trajectories/{trajectory}/v1",
                api_key="-",
                max_retries=0,
                timeout=30,
            )
            try:
                reward = play(client)
                httpx.post(f"{url}/trajectories/{trajectory}/finish", json={"reward": reward}, timeout=30)
            except (openai.APIError, httpx.HTTPError):
                return  # the run finished (503) or stopped serving
            played.append((trajectory, reward))


def play(client: openai.OpenAI) -> float:
    messages: list[dict] = []
    correct = 0
    for letters in ("a b", "c d"):
        messages.append({"role": "user", "content": f"copy {letters}:"})
        answer = client.chat.completions.create(model="asyncrl-policy", messages=messages, max_tokens=8)
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))
        correct += (answer.choices[0].message.content or "").split() == letters.split()
    return correct / 2


def test_a_run_trains_on_the_trajectories_an_external_harness_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = load_run_config(
        None,
        [
            "producer=external",
            f"output_dir={out}",
            f"controller.num_steps={NUM_STEPS}",
            "controller.mode=async",
            "buffer.async_ratio=1",
            f"rollout.rollout_batch_size={BATCH}",
            f"rollout.num_return_sequences={GROUP}",
            "serve.port=0",
            "serve.chat_format=plain",
            "model.device=cpu",
        ],
    )
    records: list[StepRecord] = []
    controllers: list[Controller] = []
    original_metrics, original_controller = training.step_metrics, training.assemble_controller

    def capture_record(record: StepRecord, *args: object) -> dict[str, float]:
        records.append(record)
        return original_metrics(record, *args)

    def capture_controller(*args: object, **kwargs: object) -> Controller:
        controllers.append(original_controller(*args, **kwargs))
        return controllers[-1]

    stop = threading.Event()
    played: list[tuple[str, float]] = []
    thread = threading.Thread(target=harness, args=(out, stop, played), daemon=True)
    thread.start()
    training.step_metrics, training.assemble_controller = capture_record, capture_controller
    try:
        summary = asyncio.run(training.train(config, console=None))
    finally:
        training.step_metrics, training.assemble_controller = original_metrics, original_controller
        stop.set()
        thread.join(30)
    assert summary.steps == NUM_STEPS and summary.trained_samples == NUM_STEPS * BATCH * GROUP
    rewards = dict(played)
    for record in records:
        for group in record.groups:
            ids = [t.info["trajectory_id"] for t in group.trajectories]
            assert len({i.split("-")[0] for i in ids}) == 1  # a group is one harness group
            for t in group.trajectories:
                assert t.reward == rewards[t.info["trajectory_id"]]
                assert t.info["turns"] == 2 and sum(t.loss_mask) > 0
                assert 0 <= record.version - t.start_version <= 1  # the α rule
    producer = controllers[0].producer
    accounting = controllers[0].buffer.accounting()
    assert accounting.num_in_flight == 0
    assert (
        accounting.num_admitted
        == accounting.num_trained + accounting.num_buffered + accounting.num_dropped_total
    )
    assert producer.counts["groups"] == accounting.num_admitted
