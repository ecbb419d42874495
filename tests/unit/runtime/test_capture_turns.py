"""``engine.capture_turns``: in the inline runtime no CUDA graph capture of an engine overlaps a call of the
trainer on the same device (during a capture PyTorch's allocator does not free its cache to make room for a
trainer allocation, which then runs out of memory). A capture never waits: while the trainer holds its turn
the step decodes eagerly and the capture comes at a later step. Driven step by step, then by random schedules
of a trainer thread and an engine thread (CPU: the capture is a fake that records its interval)."""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
import types

import pytest
import torch

from asyncrl.engine.capture_turns import CaptureTurns, CaptureTurnTimeout
from asyncrl.engine.static_decode import StaticDecode
from asyncrl.runtime.inline import LocalTrainer


class Ledger:
    """Open intervals of each kind (``train``, ``capture``) and every moment one began while the other was
    open: the invariant is that none did."""

    def __init__(self) -> None:
        self.open = {"train": 0, "capture": 0}
        self.overlaps: list[str] = []
        self.counts = {"train": 0, "capture": 0}
        self._lock = threading.Lock()

    def span(self, kind: str, rng: random.Random) -> None:
        """One interval of ``kind``, other threads free to run inside it at random points."""
        other = "capture" if kind == "train" else "train"
        with self._lock:
            if self.open[other]:
                self.overlaps.append(f"{kind} began during a {other}")
            self.open[kind] += 1
            self.counts[kind] += 1
        schedule_points(rng)
        with self._lock:
            if self.open[other]:
                self.overlaps.append(f"{kind} ran into a {other}")
            self.open[kind] -= 1


def schedule_points(rng: random.Random) -> None:
    """A random number of points where another thread may run (no timing: each gives up the GIL)."""
    for _ in range(rng.randrange(6)):
        time.sleep(0)


class Trainer:
    """A trainer whose steps record their interval in ``ledger``."""

    def __init__(self, ledger: Ledger, rng: random.Random) -> None:
        self.ledger, self.rng = ledger, rng
        self.step = self.version = 0

    def train_step(self, groups, policy_version) -> dict[str, float]:
        self.ledger.span("train", self.rng)
        self.step += 1
        return {}


def engine_decode(turns: CaptureTurns | None, ledger: Ledger, rng: random.Random) -> StaticDecode:
    """A static decode that captures, as on CUDA, through a fake capture recording its interval."""
    static = StaticDecode(
        lambda inputs, groups: inputs[0, :, None].float().expand(-1, 5).clone(),
        num_slots=4,
        max_len=100,
        device=torch.device("cpu"),
        capture=False,
        fingerprint=lambda: addresses[0],
        turns=turns,
    )
    static.capture = True
    addresses = [(0,)]

    def capture(batch, groups):
        ledger.span("capture", rng)
        static.logits = torch.zeros(4, 5)
        return types.SimpleNamespace(replay=lambda: None)

    static._capture = capture
    static.move = lambda: addresses.__setitem__(0, (addresses[0][0] + 1,))  # every graph captured again
    return static


def step(static: StaticDecode, rows: int) -> None:
    static.run([7] * rows, list(range(3, 3 + rows)), list(range(3, 3 + rows)))


def engine_loop(static: StaticDecode, rng: random.Random) -> None:
    """The engine thread: steps of random batch sizes, the addresses moving now and then."""
    for _ in range(40):
        if rng.random() < 0.3:
            static.move()
        step(static, rng.choice([1, 2, 3, 4]))


@pytest.fixture(autouse=True)
def graph_pools(monkeypatch) -> None:
    """Graph pool ids as on CUDA (a recapture over moved addresses takes a fresh one)."""
    ids = itertools.count()
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(ids)))


def test_a_capture_due_while_the_trainer_works_waits_for_a_later_step():
    turns, ledger, rng = CaptureTurns(timeout_s=5.0), Ledger(), random.Random(0)
    trainer = LocalTrainer(Trainer(ledger, rng), 1, capture_turns=turns)
    static = engine_decode(turns, ledger, rng)

    def engine_step_meanwhile() -> None:  # the engine's thread steps while the trainer's call runs
        thread = threading.Thread(target=step, args=(static, 2))
        thread.start()
        thread.join(timeout=10.0)
        assert not thread.is_alive(), "the engine's step waited for the trainer"

    try:
        trainer.on_training_thread(engine_step_meanwhile)
        assert static.total.captures == 0 and static.total.captures_deferred == 1 and not static.graphs
        assert static.wake.captures_deferred == 1  # counted per wake too, as the step it made eager
        step(static, 2)  # the trainer is idle: captured now
        assert static.total.captures == 1 and static.stats()["decode_captures_deferred"] == 1
    finally:
        trainer.shutdown()


def test_a_trainer_call_during_a_capture_waits_for_it_and_past_its_deadline_fails_by_name():
    turns = CaptureTurns(timeout_s=0.05)
    with turns.capture_turn() as free:
        assert free
        with (
            pytest.raises(CaptureTurnTimeout, match="runtime.control_timeout_s=0.05"),
            turns.trainer_turn(),
        ):
            pass
        with turns.capture_turn() as second:  # one capture at a time in the process, as torch asks
            assert not second
    with turns.trainer_turn():  # the capture ended: the trainer's turn is free
        pass


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "unshared"])
def test_no_capture_overlaps_a_trainer_call_under_random_schedules(shared):
    """A trainer thread and an engine thread, interleaved at random points, the engine's addresses moving at
    random (so shapes are captured again and again): with the turns shared no capture interval ever overlaps a
    train step; unshared (the old wiring) some do over these seeds, which shows the schedules reach overlaps."""
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    overlaps, captures, deferred = [], 0, 0
    try:
        for seed in range(20):
            rng = random.Random(seed)
            ledger = Ledger()
            turns = CaptureTurns(timeout_s=10.0)
            trainer = LocalTrainer(Trainer(ledger, random.Random(seed + 1000)), 1, capture_turns=turns)
            static = engine_decode(turns if shared else None, ledger, rng)
            engine = threading.Thread(target=engine_loop, args=(static, rng))
            engine.start()
            try:
                for _ in range(15):
                    trainer.train_step([], 0)
            finally:
                engine.join(timeout=30.0)
                trainer.shutdown()
            assert not engine.is_alive(), f"seed {seed}: the engine thread did not finish"
            assert ledger.counts["train"] == 15, f"seed {seed}"
            overlaps += [f"seed {seed}: {overlap}" for overlap in ledger.overlaps]
            captures += static.total.captures
            deferred += static.total.captures_deferred
    finally:
        sys.setswitchinterval(switch_interval)
    assert captures > 0
    if shared:
        assert overlaps == [] and deferred > 0
    else:
        assert overlaps and deferred == 0
