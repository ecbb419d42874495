"""A call over every trainer rank fails at the first rank that fails (``runtime.rank_calls``), over randomized
schedules of which rank answers when, and how.

The ranks are fakes under a fake ``ray``: each rank answers (a value or one of Ray's errors) in a shuffled order,
or never (blocked in a collective a failed peer will never join). ``ray.wait`` hands out the next answer due, or
nothing once only blocked ranks are left, which is what a real wait does when its deadline passes. The invariants
hold for every schedule: the call raises on the first failure taken, naming that rank and its error; the ranks
still running are killed and no other; an error the ranks agree on waits for every rank and kills none."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ray.exceptions import ActorDiedError, RayTaskError

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.runtime import rank_calls
from asyncrl.runtime.errors import TrainerDied
from asyncrl.runtime.trainer_group import TrainerGroupClient
from asyncrl.trainer.checkpoint import STATE_FILE, TornCheckpointError, write_marker
from asyncrl.trainer.optim import NonFiniteGradientError

BLOCKS = "blocks"
"""A rank's outcome: it never answers (waiting in a collective)."""


@dataclass(eq=False)
class Ref:
    rank: int


@dataclass
class Schedule:
    """Each rank's outcome (a value, an exception it raised, ``ActorDiedError``, or ``BLOCKS``) and the order
    the answers land in."""

    outcomes: list[Any]
    order: list[int]
    killed: list[int] = field(default_factory=list)

    def landed(self) -> list[int]:
        """The ranks that answer, in the order they do."""
        return [rank for rank in self.order if self.outcomes[rank] is not BLOCKS]


class FakeRay:
    """``ray.wait`` / ``ray.get`` / ``ray.kill`` over one ``Schedule``."""

    def __init__(self, schedule: Schedule, handles: list[str]) -> None:
        self.schedule = schedule
        self.handles = handles
        self.taken: set[int] = set()

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list[Ref], list[Ref]]:
        assert num_returns == 1 and timeout >= 0
        waiting = {ref.rank: ref for ref in refs}
        due = [rank for rank in self.schedule.landed() if rank in waiting]
        if not due:
            return [], refs
        ready = waiting[due[0]]
        return [ready], [ref for ref in refs if ref is not ready]

    def get(self, ref: Ref, timeout: float) -> Any:
        assert timeout == 0  # only ready refs are fetched
        self.taken.add(ref.rank)
        outcome = self.schedule.outcomes[ref.rank]
        if isinstance(outcome, ActorDiedError):
            raise outcome
        if isinstance(outcome, BaseException):
            traceback = f"Traceback (most recent call last):\n  rank {ref.rank}'s frames\n{outcome!r}"
            raise RayTaskError("train_step", traceback, outcome).as_instanceof_cause()
        return outcome

    def kill(self, handle: str, no_restart: bool) -> None:
        assert no_restart
        self.schedule.killed.append(self.handles.index(handle))


def oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


KINDS = {
    "ok": lambda rank: {"rank": rank},
    "oom": lambda rank: oom(),
    "died": lambda rank: ActorDiedError(),
    "config": lambda rank: ValueError("loss.clip_ratio must be > 0"),
    "blocks": lambda rank: BLOCKS,
}


def random_schedule(rng: random.Random, kinds: list[str]) -> Schedule:
    world_size = rng.randint(1, 5)
    outcomes = [KINDS[rng.choice(kinds)](rank) for rank in range(world_size)]
    order = rng.sample(range(world_size), world_size)
    return Schedule(outcomes, order)


def run(schedule: Schedule, agreed: tuple[type[BaseException], ...] = ()) -> Any:
    handles = [f"rank-{rank}" for rank in range(len(schedule.outcomes))]
    fake = FakeRay(schedule, handles)
    refs = [Ref(rank) for rank in range(len(handles))]
    original = rank_calls.ray
    rank_calls.ray = fake
    try:
        return rank_calls.call_ranks(handles, refs, "trainer: train_step(v3)", 60.0, agreed=agreed)
    finally:
        rank_calls.ray = original


@pytest.mark.parametrize("seed", range(300))
def test_the_first_failure_taken_fails_the_call_by_rank_and_stops_the_ranks_still_running(seed: int) -> None:
    rng = random.Random(seed)
    schedule = random_schedule(rng, list(KINDS))
    failures = [r for r in schedule.landed() if not isinstance(schedule.outcomes[r], dict)]
    blocked = [r for r in range(len(schedule.outcomes)) if schedule.outcomes[r] is BLOCKS]
    if not failures and not blocked:
        assert run(schedule) == schedule.outcomes  # in rank order, whatever order they landed in
        assert schedule.killed == []
        return
    if not failures:  # only ranks that never answer: the deadline fails the call
        with pytest.raises(TrainerDied, match=r"no answer within 60.0 s"):
            run(schedule)
        assert sorted(schedule.killed) == blocked
        return
    first = failures[0]
    landed = schedule.landed()
    answered_before = set(landed[: landed.index(first)])
    still_running = sorted(set(range(len(schedule.outcomes))) - answered_before - {first})
    cause = schedule.outcomes[first]
    if isinstance(cause, ValueError):  # the run's fault: raised as it is, not retried as a lost trainer
        with pytest.raises(ValueError) as raised:
            run(schedule)
        assert not isinstance(raised.value, TrainerDied)
        assert raised.value.cause is cause  # Ray's task error, an instance of the rank's own
    elif isinstance(cause, ActorDiedError):
        with pytest.raises(
            TrainerDied, match=rf"train_step\(v3\): the trainer is lost \(rank {first}: the actor died"
        ):
            run(schedule)
    else:
        with pytest.raises(
            TrainerDied, match=rf"rank {first}: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
        ):
            run(schedule)
    assert sorted(schedule.killed) == still_running  # the failed rank and the ones done stay, for shutdown


@pytest.mark.parametrize("seed", range(100))
def test_an_error_the_ranks_agree_on_waits_for_every_rank_and_keeps_the_group(seed: int) -> None:
    """A load's ``TornCheckpointError``: every rank raises it after the same gathers, so the call waits for all
    (the group stays usable for the previous checkpoint) and raises it as the rank did."""
    rng = random.Random(seed)
    schedule = random_schedule(rng, ["ok"])
    torn = [rank for rank in range(len(schedule.outcomes)) if rng.random() < 0.7] or [0]
    for rank in torn:
        schedule.outcomes[rank] = TornCheckpointError(
            f"step_8: sharded/__{rank}_0.distcp does not match its hash"
        )
    with pytest.raises(TornCheckpointError, match="does not match its hash") as raised:
        run(schedule, agreed=(TornCheckpointError,))
    first_torn = next(rank for rank in schedule.landed() if rank in torn)
    assert raised.value.cause is schedule.outcomes[first_torn]
    assert schedule.killed == []


def test_a_rank_that_never_agrees_is_still_bounded_by_the_deadline() -> None:
    schedule = Schedule([TornCheckpointError("step_8: torn"), BLOCKS], order=[0, 1])
    with pytest.raises(TrainerDied, match=r"ranks \[1\]: no answer within 60.0 s"):
        run(schedule, agreed=(TornCheckpointError,))
    assert schedule.killed == [1]


def test_each_wait_takes_only_what_is_left_of_the_calls_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three ranks landing 20 s apart on a stepped clock: the waits get 60, 40, 20 s, never a fresh 60."""
    now = [0.0]
    monkeypatch.setattr(rank_calls, "monotonic", lambda: now[0])
    schedule = Schedule([{"rank": 0}, {"rank": 1}, {"rank": 2}], order=[2, 0, 1])
    timeouts: list[float] = []

    class SteppingRay(FakeRay):
        def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list[Ref], list[Ref]]:
            timeouts.append(timeout)
            now[0] += 20.0
            return super().wait(refs, num_returns, timeout)

    handles = ["rank-0", "rank-1", "rank-2"]
    monkeypatch.setattr(rank_calls, "ray", SteppingRay(schedule, handles))
    refs = [Ref(rank) for rank in range(3)]
    assert rank_calls.call_ranks(handles, refs, "trainer: alive", 60.0) == schedule.outcomes
    assert timeouts == [60.0, 40.0, 20.0]


def test_a_diverging_run_is_the_runs_fault_not_a_lost_trainer() -> None:
    """Non-finite gradients past ``trainer.max_consecutive_skipped_updates`` end the run with their error: a
    restart from the last checkpoint would diverge again (every rank raises it after the same global norm)."""
    diverged = NonFiniteGradientError("6 optimizer updates in a row had a non-finite gradient norm")
    schedule = Schedule([diverged, diverged], [0, 1])
    with pytest.raises(NonFiniteGradientError) as raised:
        run(schedule)
    assert not isinstance(raised.value, TrainerDied) and raised.value.cause is diverged


def test_an_error_is_described_by_its_qualified_type_and_text() -> None:
    assert rank_calls.describe(oom()).startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert rank_calls.describe(OSError(28, "No space left on device")) == (
        "OSError: [Errno 28] No space left on device"
    )


class LoadRank:
    """A trainer rank's handle whose ``load_checkpoint`` calls are ``Ref``s of its rank."""

    def __init__(self, rank: int) -> None:
        self.load_checkpoint = SimpleNamespace(remote=lambda path: Ref(rank))


@pytest.mark.parametrize(
    ("error", "tries"),
    [(oom(), 2), (ValueError("run config: trainer.lr must be > 0"), 1)],
    ids=["out-of-memory", "config-error"],
)
def test_the_restart_loop_restarts_a_lost_rank_but_not_a_fault_of_the_run(
    error: Exception, tries: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through ``app.train``: rank 1's load fails while rank 0 waits. An out-of-memory error is the trainer
    lost: the run restarts from its checkpoint (``runtime.trainer_restarts=1``), then fails with ``TrainerDied``
    naming rank 1 and the error; a configuration error ends the run at once with that error."""
    out = tmp_path / "run"
    step = out / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    (step / STATE_FILE).write_bytes(b"a verified checkpoint the fake ranks never read")
    write_marker(step)
    overrides = ["runtime.type=local", "trainer.num_workers=2", "runtime.trainer_restarts=1"]
    config = load_run_config(
        None, [*overrides, "engine.max_model_len=64", f"output_dir={out}", f"resume={out}"]
    )
    schedules: list[Schedule] = []

    @contextlib.contextmanager
    def parts(run_config: Any) -> Iterator[Any]:
        handles = [LoadRank(rank) for rank in range(2)]
        schedules.append(Schedule([BLOCKS, error], order=[1, 0]))
        monkeypatch.setattr(rank_calls, "ray", FakeRay(schedules[-1], handles))
        progress = [{"step": 0, "version": 0, "checkpoint_bytes": 10**6}] * 2
        group = TrainerGroupClient(handles, RuntimeConfig(type="local"), progress, WeightSyncConfig())
        yield SimpleNamespace(config=run_config, trainer=group, locations=dict)

    monkeypatch.setattr(training, "runtime_parts", parts)
    console = io.StringIO()
    expected = TrainerDied if tries == 2 else ValueError
    with pytest.raises(expected) as raised:
        asyncio.run(training.train(config, console=console))
    if tries == 2:
        assert str(raised.value).startswith(
            "trainer: load_checkpoint: the trainer is lost (rank 1: torch.OutOfMemoryError: CUDA out of memory"
        )
        assert f"restart 1 from {step}" in console.getvalue()
    else:
        assert not isinstance(raised.value, TrainerDied)
    assert len(schedules) == tries
    assert all(schedule.killed == [0] for schedule in schedules)  # rank 0, waiting, killed each time
