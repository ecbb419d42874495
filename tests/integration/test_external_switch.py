"""``producer: external`` under ``runtime.switch`` (colocated sync; on CPU the shared-memory twin): harnesses
written only against the ``openai`` client play through a run whose engine sleeps for every step and every
checkpoint, and what they see is what a run without the switch shows them: every call answered (or, once the
run stops taking trajectories, the documented 503 and then a closed port), every step trained, every group
accounted for in the ledger.

The case the switch adds is a call on the engine as it falls asleep: the proxy stops that call's
``proxy.request_timeout_s`` clock (``LLMProxy.suspend(engines_asleep=True)``), so a checkpoint slower than the
timeout does not fail it as an engine timeout (a 503 to the harness, a failure counted against a healthy
engine). The run makes that case happen rather than hope for it: before its first periodic checkpoint it waits
for a harness call on the engine and pauses the engine there (so the call cannot finish before the switch
sleeps it), and that save takes one and a half timeouts. (The later saves find calls on the sleeping engine
too, as a rule, though nothing forces it: the calls the step held go to the engine as its update lands, just
before the save.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.controller.controller import Controller, StepRecord
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.runtime.inline import LocalTrainer

NUM_STEPS, BATCH, GROUP, HARNESSES = 3, 2, 2, 3
"""Three harnesses for two groups a step: one always waits for admission while a step trains."""
REQUEST_TIMEOUT_S = 4.0
"""``proxy.request_timeout_s``: far above an 8-token call of the tiny model, even on a CI box whose two cores
run another test file beside this one (a call that did time out fails the test as an engine timeout)."""
SLOW_SAVE_S = 1.5 * REQUEST_TIMEOUT_S
"""How long the first save takes, a harness call frozen on its sleeping engine: a clock that ran through it
would expire (as it did when ``app.train._save`` did not hold the proxy's calls)."""
WAIT_S = 60.0
"""The deadline of every wait in the test (a batch, the harnesses' calls and their end, the call to freeze)."""
RUN_STOPPED = "the training run stopped taking trajectories"
"""The 503 a call opening a group gets once the run finished (docs/agents.md)."""


@dataclass(frozen=True)
class Call:
    """One harness request: ``error`` is empty when it was answered; ``refusal`` whether the error is one a run
    that stopped taking trajectories answers with (its 503, or a port no longer served); ``run_closed`` whether
    the run had stopped (its buffer closed) when the answer came."""

    trajectory: str
    error: str
    run_closed: bool
    refusal: bool = False


def failed_call(trajectory: str, error: Exception, run_closed: bool) -> Call:
    stopped = RUN_STOPPED in str(error) or isinstance(error, openai.APIConnectionError | httpx.TransportError)
    return Call(trajectory, f"{type(error).__name__}: {error}", run_closed, refusal=stopped)


def harness(out: Path, name: str, run_closed: Callable[[], bool], calls: list[Call]) -> None:
    """Play groups of GROUP two-turn episodes, member by member, each group named in the URL, until the run
    stops taking trajectories; an episode that fails before is aborted and the next one played."""
    endpoint = out / "endpoint.json"
    deadline = time.monotonic() + WAIT_S
    while not endpoint.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
    url = json.loads(endpoint.read_text())["url"].removesuffix("/v1")
    for game in range(1, 1000):
        for member in range(GROUP):
            trajectory = f"{name}-g{game}-{member}"
            client = openai.OpenAI(
                base_url=f"{url}/groups/{name}-g{game}/trajectories/{trajectory}/v1",
                api_key="-",
                max_retries=0,
                timeout=WAIT_S,
            )
            try:
                play(client, trajectory, calls, run_closed)
                httpx.post(f"{url}/trajectories/{trajectory}/finish", json={"reward": 1.0}, timeout=WAIT_S)
            except (openai.APIError, httpx.HTTPError) as error:
                calls.append(failed_call(trajectory, error, run_closed()))
                if run_closed():
                    return
                # a failure the test reports: the episode ends so that its group, and the run, go on
                with contextlib.suppress(httpx.HTTPError):
                    body = {"reason": "the harness saw an error"}
                    httpx.post(f"{url}/trajectories/{trajectory}/abort", json=body, timeout=WAIT_S)


def play(client: openai.OpenAI, trajectory: str, calls: list[Call], run_closed: Callable[[], bool]) -> None:
    messages: list[dict] = []
    for letters in ("a b", "c d"):
        messages.append({"role": "user", "content": f"copy {letters}:"})
        answer = client.chat.completions.create(model="asyncrl-policy", messages=messages, max_tokens=8)
        calls.append(Call(trajectory, "", run_closed()))
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))


@dataclass
class Run:
    """What the test reads of the run as it goes."""

    engines: list[Any]
    controllers: list[Controller]
    records: list[StepRecord]
    saves: list[dict[str, Any]]
    """Per save, as the trainer writes it: each engine's sleep level, and the requests queued on it."""

    @property
    def proxy(self) -> LLMProxy:
        return self.controllers[0].proxy  # type: ignore[return-value]


def watch(monkeypatch: pytest.MonkeyPatch) -> Run:
    """Capture the run's engines, controller and step records; freeze a harness call on the engine before the
    first save, and make that save take ``SLOW_SAVE_S``."""
    run = Run(engines=[], controllers=[], records=[], saves=[])
    parts_of, assemble, metrics_of = (
        training.runtime_parts,
        training.assemble_controller,
        training.step_metrics,
    )
    save_of, local_save = training._save, LocalTrainer.save_checkpoint

    @contextlib.contextmanager
    def parts(config: Any) -> Iterator[Any]:
        with parts_of(config) as built:
            run.engines[:] = built.engines
            yield built

    def controller(*args: Any, **kwargs: Any) -> Controller:
        run.controllers.append(assemble(*args, **kwargs))
        return run.controllers[-1]

    def metrics(record: StepRecord, *args: Any) -> dict[str, float]:
        run.records.append(record)
        return metrics_of(record, *args)

    async def save(parts: Any, proxy: LLMProxy, out: Path, extra: dict[str, Any]) -> Path:
        if run.saves:
            return await save_of(parts, proxy, out, extra)
        async with call_frozen_on_the_engine(proxy, run.engines):
            return await save_of(parts, proxy, out, extra)

    def slow_save(self: LocalTrainer, root: Any, **kwargs: Any) -> Path:
        stats = [engine.stats() for engine in run.engines]
        queued = [s["running"] + s["waiting"] for s in stats]
        run.saves.append({"asleep": [s["asleep"] for s in stats], "queued": queued})
        if len(run.saves) == 1 and any(queued):  # the save the frozen call is on the sleeping engine for
            time.sleep(SLOW_SAVE_S)  # the save under test is slow; nothing waits on this for its order
        return local_save(self, root, **kwargs)

    monkeypatch.setattr(training, "runtime_parts", parts)
    monkeypatch.setattr(training, "assemble_controller", controller)
    monkeypatch.setattr(training, "step_metrics", metrics)
    monkeypatch.setattr(training, "_save", save)
    monkeypatch.setattr(LocalTrainer, "save_checkpoint", slow_save)
    return run


@contextlib.asynccontextmanager
async def call_frozen_on_the_engine(proxy: LLMProxy, engines: list[Any]):  # type: ignore[no-untyped-def]
    """Once a harness call is on an engine, pause the engines (the call stays queued there, as a sleeping
    engine keeps it) until the block ends: the save's switch then sleeps them with the call on them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        while not sum(engine["in_flight"] for engine in proxy.stats()["engines"]):
            assert loop.time() < deadline, f"no harness call reached an engine within {WAIT_S} s"
            await asyncio.sleep(1e-3)
        for engine in engines:
            await engine.pause()
        if any(s["running"] + s["waiting"] for s in (engine.stats() for engine in engines)):
            break
        for engine in engines:  # the call ended before the pause: wait for the next one
            await engine.resume()
    try:
        yield
    finally:
        for engine in engines:
            await engine.resume()


def test_harness_calls_through_a_switched_run_never_time_out_for_the_engines_sleep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    config = load_run_config(
        None,
        [
            "producer=external",
            f"output_dir={out}",
            f"controller.num_steps={NUM_STEPS}",
            "controller.mode=sync",
            "buffer.async_ratio=0",
            f"buffer.get_batch_timeout_s={WAIT_S}",
            "runtime.switch.enabled=true",
            "trainer.checkpoint_every=1",
            f"proxy.request_timeout_s={REQUEST_TIMEOUT_S}",
            f"rollout.rollout_batch_size={BATCH}",
            f"rollout.num_return_sequences={GROUP}",
            "serve.port=0",
            "serve.chat_format=plain",
            "model.device=cpu",
            "metrics.trackers=[jsonl]",
        ],
    )
    run = watch(monkeypatch)
    calls: list[Call] = []

    def run_closed() -> bool:
        return bool(run.controllers) and run.controllers[0].buffer.closed

    threads = [
        threading.Thread(target=harness, args=(out, f"h{i}", run_closed, calls), daemon=True)
        for i in range(HARNESSES)
    ]
    for thread in threads:
        thread.start()
    summary = asyncio.run(training.train(config, console=None))
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads), "a harness did not end with the run"

    # every call answered until the run stopped taking trajectories; then only its documented refusal
    failed = [call for call in calls if call.error and not call.run_closed]
    assert not failed, failed
    assert all(call.refusal for call in calls if call.error), calls
    stats = run.proxy.stats()
    assert stats["num_timeouts"] == 0, stats
    assert [engine["num_failures"] for engine in stats["engines"]] == [0], stats
    assert stats.get("num_engine_restarts", 0) == 0, stats

    # every step trained, every save made with the engine asleep, one with a harness call on it
    assert summary.steps == NUM_STEPS and summary.trained_samples == NUM_STEPS * BATCH * GROUP
    assert [record.step for record in run.records] == list(range(1, NUM_STEPS + 1))
    assert len(run.saves) == NUM_STEPS and all(save["asleep"] == [1] for save in run.saves), run.saves
    assert run.saves[0]["queued"] != [0], run.saves
    assert Path(summary.checkpoint).is_dir()
    assert_the_engine_switched_each_step_and_save(run, out)
    assert_every_group_accounted_for(run, out)


def assert_the_engine_switched_each_step_and_save(run: Run, out: Path) -> None:
    """The engine slept and woke for each step and each checkpoint (the last step's is the final one), as each
    step's colocate metrics say too."""
    (engine,) = run.engines
    assert (engine.core.num_sleeps, engine.core.num_wakes) == (2 * NUM_STEPS, 2 * NUM_STEPS)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in steps if "train/colocate/sleep_bytes" in line]
    assert len(steps) == NUM_STEPS
    for line in steps:
        assert line["train/colocate/sleep_bytes"] > 0, line
        assert line["train/colocate/wake_bytes"] == line["train/colocate/sleep_bytes"], line
    for line in steps[1:]:  # the checkpoint after the step before
        assert line["train/colocate/checkpoint_sleep_bytes"] > 0, line
        assert line["train/colocate/checkpoint_engine_failures"] == 0, line


def assert_every_group_accounted_for(run: Run, out: Path) -> None:
    """The buffer's conservation, and one fate per admitted group in the run's ledger: trained (one line a
    member), dropped or unfinished (one line)."""
    controller = run.controllers[0]
    producer, accounting = controller.producer, controller.buffer.accounting()
    assert accounting.num_in_flight == 0
    assert (
        accounting.num_admitted
        == accounting.num_trained + accounting.num_buffered + accounting.num_dropped_total
    )
    assert producer.counts["groups"] == accounting.num_admitted
    fates: dict[str, list[str]] = {}
    for line in (out / "ledger.jsonl").read_text().splitlines():
        entry = json.loads(line)
        fates.setdefault(entry["prompt"], []).append(entry["event"])
    admitted = {group.prompt.key for group in producer._group_of.values()}
    assert len(admitted) == accounting.num_admitted
    for key in admitted:
        assert fates.get(key) in (["trained"] * GROUP, ["dropped"], ["unfinished"]), (key, fates.get(key))
    trained = [key for key, events in fates.items() if events[0] == "trained"]
    assert len(trained) == NUM_STEPS * BATCH, fates
