"""A checkpoint is saved off the event loop (``app.train._save``), and still matches the step it saves.

A run's trainer save takes minutes at scale; on the loop it stopped everything the loop runs (routing, rewards,
engine control), and a ``wait_for`` whose deadline passed meanwhile could fail once the loop ran again. Here
``app.train.train`` runs whole on fakes (scripted engines, a trainer facade of blocking calls, the real proxy,
producer, buffer, controller, rewards and ledger) on loops that shuffle their ready callbacks by seed. Its save
is gated: it returns only once the loop has run, during the save, a ``wait_for`` on an actor-call-shaped future
and a reward evaluation through the run's own reward service, and the rollout has moved on if a request was
generating (on the old code, the save on the loop's thread, none of it could run and the gate's deadline failed
the run). Invariants, every seed, every mode:

- nothing else enters the trainer during a save (no ``train_step``, no weight publication), and the trainer's
  step is the same when the save ends as when it began;
- the ``extra`` saved is not changed while the save runs, though the rollout goes on;
- it is the state of the step saved: the prompts it counts as consumed are exactly those the ledger has trained
  up to that step, the ledger lines it counts end at that step, and every prompt drawn by then has one fate in
  it: ended (trained or dropped) in the ledger lines it counts, or unfinished;
- the final checkpoint's ``unfinished`` ledger lines are exactly its prompts to restore or regenerate.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.data.registry import make_task
from asyncrl.rewards.service import RewardService, RewardStatus
from asyncrl.sim.clock import run_seeds
from asyncrl.testing.fake_engine import FakeEngine

NUM_STEPS = 3
GATE_S = 20.0
"""How long a save waits for the loop to run its probe: far beyond what the probe needs on a free loop."""
ACTOR_CALL_S = 5.0
"""The probe's ``wait_for`` deadline, as an actor call's (``runtime.actor_calls.await_actor``)."""
MODES = {
    "sync": ("controller.mode=sync", "buffer.async_ratio=0"),
    "async": ("controller.mode=async", "buffer.async_ratio=2"),
    "partial_rollout": ("controller.mode=partial_rollout", "buffer.async_ratio=1"),
    "multi_version": ("controller.mode=multi_version", "buffer.async_ratio=1"),
}


class FakeTokenizer:
    """Enough of a tokenizer for the producer: no chat template, a few ids per prompt."""

    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [1 + (ord(c) % 50) for c in text[:4]]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, token_ids))


class LoopBlocked(AssertionError):
    """The event loop did not run the probe within ``GATE_S`` of a save: the save blocked it."""


class TrainerOverlap(AssertionError):
    """A trainer call began while another ran (a step or a publication during a save)."""


@dataclass
class Save:
    step: int
    extra: dict[str, Any]


class GatedTrainer:
    """A trainer facade of blocking calls (as the inline and Ray ones; the run calls them in worker threads):
    steps are counted, and a save calls ``gate`` (which waits for the loop) before it returns."""

    def __init__(self, rng: random.Random, gate: Callable[[], None]) -> None:
        self.step = self.version = 0
        self.saves: list[Save] = []
        self._rng, self._gate = rng, gate
        self._busy = threading.Lock()

    @contextlib.contextmanager
    def _alone(self, call: str) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise TrainerOverlap(f"trainer: {call} began while another call ran")
        try:
            time.sleep(self._rng.choice([0.0, 0.0, 1e-3]))  # a yield point of random length
            yield
        finally:
            self._busy.release()

    def train_step(self, groups: list[Any], policy_version: int) -> dict[str, float]:
        with self._alone("train_step"):
            self.step += 1
            self.version = policy_version + 1
            return {}

    def state_for_sync(self) -> dict[str, int]:
        with self._alone("state_for_sync"):
            return {"step": self.step}

    def save_checkpoint(self, root: Path, *, extra: dict[str, Any], keep_last: int | None) -> Path:
        with self._alone("save_checkpoint"):
            step, frozen = self.step, json.dumps(extra, sort_keys=True)
            self._gate()
            assert self.step == step, f"the trainer moved from step {step} to {self.step} during its save"
            assert json.dumps(extra, sort_keys=True) == frozen, f"step {step}: extra changed during the save"
            self.saves.append(Save(step, json.loads(frozen)))
            return Path(root) / f"step_{step:08d}"

    def check_alive(self) -> None:
        """Nothing to check: the fake lives in this process."""


def rollout_state(engines: list[FakeEngine]) -> tuple[list[int], dict[str, int]]:
    """Requests each engine received, and the tokens of each running request: changed by any rollout work."""
    running = {rid: len(run.token_ids) for engine in engines for rid, run in engine.running.items()}
    return [len(engine.received) for engine in engines], running


def probe_gate(
    loop: asyncio.AbstractEventLoop,
    rewards: RewardService,
    sample: Any,
    engines: list[FakeEngine],
    rolled: list[bool],
) -> Callable[[], None]:
    """What a save waits for (in its worker thread), within ``GATE_S``: the loop running an actor-call-shaped
    ``wait_for`` and a reward evaluation to their ends, and, when a request is generating as the save begins,
    the rollout moving on (appended to ``rolled``: whether it had work to move on with)."""

    async def probe() -> None:
        before = rollout_state(engines)
        generating = any(engine.running and not engine.paused for engine in engines)
        call: concurrent.futures.Future[str] = concurrent.futures.Future()  # as a Ray ref's ``future()``
        threading.Thread(target=call.set_result, args=("ok",)).start()  # answered by another thread
        answer = await asyncio.wait_for(asyncio.wrap_future(call), ACTOR_CALL_S)
        scored = await rewards.score(sample.answer, sample)
        assert answer == "ok" and scored.status is RewardStatus.OK, scored
        while generating and rollout_state(engines) == before:
            await asyncio.sleep(1e-3)  # a token is due every step_s of loop time
        rolled.append(generating)

    def gate() -> None:
        running = asyncio.run_coroutine_threadsafe(probe(), loop)
        try:
            running.result(timeout=GATE_S)
        except concurrent.futures.TimeoutError:
            running.cancel()
            raise LoopBlocked(f"the event loop ran nothing for {GATE_S} s of a checkpoint's save") from None

    return gate


async def run(
    mode: str, seed: int, out: Path, monkeypatch: pytest.MonkeyPatch, rolled: list[bool]
) -> tuple[GatedTrainer, Path]:
    await asyncio.to_thread(int)  # threads call back into this loop: the deadlock check must know they exist
    config = load_run_config(
        None,
        [
            *MODES[mode],
            f"controller.num_steps={NUM_STEPS}",
            "controller.eval_prompts=0",
            "rollout.rollout_batch_size=2",
            "rollout.num_return_sequences=2",
            "rollout.max_new_tokens=16",
            "rollout.num_engines=2",
            "engine.max_model_len=64",
            "task.num_train=64",
            "task.num_eval=8",
            "trainer.checkpoint_every=1",
            "metrics.trackers=[jsonl]",
            f"output_dir={out}",
            f"seed={seed}",
        ],
    )
    task = make_task(config.task)
    rewards = RewardService.from_config(config.reward)
    engines = [FakeEngine(lengths=6, step_s=1e-3) for _ in range(config.rollout.num_engines)]
    loop, sample = asyncio.get_running_loop(), task.split("train")[0]
    trainer = GatedTrainer(random.Random(seed), probe_gate(loop, rewards, sample, engines, rolled))

    @contextlib.contextmanager
    def parts(run_config: Any) -> Iterator[Any]:
        try:
            yield SimpleNamespace(
                config=run_config,
                task=task,
                tokenizer=FakeTokenizer(),
                trainer=trainer,
                engines=engines,
                rewards=rewards,
                engine_factory=None,
                locations=dict,
            )
        finally:
            rewards.close()

    monkeypatch.setattr(training, "runtime_parts", parts)
    await training.train(config, console=None)
    return trainer, out


def check_saves(trainer: GatedTrainer, out: Path) -> None:
    lines = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    steps = [save.step for save in trainer.saves]
    assert steps == list(range(1, NUM_STEPS + 1)), steps  # one a step, the last step's the final one
    for save in trainer.saves:
        extra, counted = save.extra, save.extra["ledger_lines"]
        assert all(line["step"] <= save.step for line in lines[:counted]), (save.step, lines[:counted])
        # after them: later steps' lines, and the run's end at this step (its drops, its unfinished prompts)
        after = lines[counted:]
        assert all(line["step"] >= save.step for line in after), (save.step, after)
        late = [line for line in after if line["event"] == "trained" and line["step"] == save.step]
        assert not late, f"step {save.step}: trained lines the checkpoint does not count: {late}"
        trained = {line["prompt"] for line in lines[:counted] if line["event"] == "trained"}
        assert set(extra["consumed_prompts"]) == trained, f"step {save.step}: consumed is not trained"
        redo = set(extra["prompt_source"]["redo"])
        assert not redo & trained, f"step {save.step}: trained prompts listed as unfinished"
        buffered = {entry["group"]["prompt_uid"] for entry in extra["buffered_groups"]}
        assert buffered <= redo, f"step {save.step}: a buffered group's prompt is not unfinished"
        ended = {line["prompt"] for line in lines[:counted] if line["event"] in ("trained", "dropped")}
        drawn = extra["prompt_source"]["cursor"]  # no resume: the stream's first prompts, each drawn once
        assert not ended & redo and len(ended) + len(redo) == drawn, (
            f"step {save.step}: of {drawn} prompts drawn, {len(ended)} ended in the ledger it counts and "
            f"{len(redo)} unfinished in it: one has no fate or two"
        )
    final = trainer.saves[-1].extra
    unfinished = [line["prompt"] for line in lines if line["event"] == "unfinished"]
    assert set(unfinished) == set(final["prompt_source"]["redo"]) and len(unfinished) == len(set(unfinished))
    assert final["ledger_lines"] == len(lines) - len(unfinished)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_save_runs_off_the_event_loop_and_saves_the_state_of_its_step(mode, tmp_path, monkeypatch):
    rolled: list[bool] = []

    async def one(seed: int) -> None:
        check_saves(*await run(mode, seed, tmp_path / f"seed{seed}", monkeypatch, rolled))

    assert run_seeds(one, range(6), virtual_time=False) == 6
    assert any(rolled), "no save began with a request generating: the rollout during a save went untested"
