"""``runtime.republish``: a replaced engine's catch-up under ``runtime.switch`` reads the held copy, or one packed
again of the same version, never one let go while it reads, never weights of another version (invariants:
the module's docstring), over real shared-memory blocks of the colocated transport."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
from collections.abc import Callable

import pytest
import torch

from asyncrl.proxy.recovery import Superseded
from asyncrl.runtime.republish import CatchUpDeadlines, Republisher, StillReading
from asyncrl.weight_sync.colocated import ColocatedSync, is_released
from asyncrl.weight_sync.protocol import WeightSyncError


class Trainer:
    """The facade a ``Republisher`` wraps: publishes ``{"w": [version] * 4}`` through the colocated transport;
    ``reading`` counts catch-ups reading a copy now, which a release must never see above 0."""

    def __init__(self, version: int = 1) -> None:
        self.version = version
        self.sync = ColocatedSync()
        self.num_packed = 0
        self.packed_for: list[int] = []
        self.reading = 0
        self.lock = threading.Lock()

    def weights(self) -> torch.Tensor:
        return torch.full((4,), float(self.version))

    def state_for_sync(self):
        self.num_packed += 1
        return self.sync.publish(self.version, {"w": self.weights()})

    def pack_for(self, engine: int):
        with self.lock:
            assert self.reading == 0, "a pack let go of the copy a catch-up reads"
        self.packed_for.append(engine)
        return self.state_for_sync()

    def release_published(self) -> int:
        with self.lock:
            assert self.reading == 0, "a copy let go while a catch-up reads it"
        return self.sync.release()

    def read(self, update) -> torch.Tensor:
        """What an engine applies: a copy of the update's tensor, read while it counts as a reader."""
        with self.lock:
            self.reading += 1
        time.sleep(random.random() * 1e-3)  # a random schedule, not a timing assertion
        (name, view), *_ = list(self.sync.receive(update))
        copied = view.clone()
        with self.lock:
            self.reading -= 1
        return copied


def released_update(trainer: Trainer, republisher: Republisher):
    """A published update every engine applied (``ColocatedTrainer.weights_applied``): held no more."""
    update = trainer.state_for_sync()
    republisher.published()
    assert republisher.release(update) == 16 and trainer.sync.held_bytes == 0
    return update


def test_a_held_update_is_lent_as_is_and_a_released_one_packed_again_of_its_version():
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(10))
    held = trainer.state_for_sync()
    assert republisher.lend(held, 0) is held and trainer.num_packed == 1
    republisher.give_back()
    assert not is_released(held) and trainer.sync.held_bytes == 16  # still the engines' until applied

    assert republisher.release(held) == 16 and trainer.sync.held_bytes == 0  # every engine applied it
    fresh = republisher.lend(held, 0)
    again = republisher.lend(held, 0)  # a second replacement catching up meanwhile shares the copy
    assert fresh is again and fresh is not held and fresh.version == held.version == 1
    assert trainer.num_packed == 2 and torch.equal(trainer.read(fresh), torch.full((4,), 1.0))
    republisher.give_back()
    assert trainer.sync.held_bytes == 16 and not is_released(fresh)  # one still reads it
    republisher.give_back()
    assert trainer.sync.held_bytes == 0 and is_released(fresh)  # the last one done lets it go
    with pytest.raises(WeightSyncError, match="v1: the trainer released"):
        trainer.sync.receive(fresh)


@pytest.mark.parametrize("moved", ["training", "published"])
def test_a_released_update_is_superseded_once_the_trainer_moved_on(moved):
    """The replacement is told to wait for the next update (``proxy.recovery`` does), naming both versions."""
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(10))
    update = released_update(trainer, republisher)
    republisher.begin_step()
    if moved == "published":
        trainer.version = 2
        trainer.state_for_sync()
        republisher.published()
    now = "v1, training its next step" if moved == "training" else "v2"
    with pytest.raises(
        Superseded, match=f"v1: the trainer let go .* now {now}, so a replaced engine is sent the next"
    ) as gone:
        republisher.lend(update, 0)
    assert gone.value.within_s == 20  # a step and its publication (10), and the switch's engine calls (10)
    assert trainer.num_packed == (1 if moved == "training" else 2)


def test_a_copy_packed_as_another_version_is_let_go_and_refused():
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(10))
    update = released_update(trainer, republisher)
    publish = trainer.state_for_sync

    def moved_on_meanwhile():
        trainer.version = 2  # the trainer's version changed after the check (a facade that misreports it)
        return publish()

    trainer.state_for_sync = moved_on_meanwhile
    with pytest.raises(WeightSyncError, match="v1: packed again as v2"):
        republisher.lend(update, 0)
    assert trainer.sync.held_bytes == 0


def race(seed: int) -> tuple[Trainer, list, list]:
    """Four catch-ups of a held update (engines 0, 1, 0, 1) race its release and the next training step, in a
    random order."""
    random.seed(seed)
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(30))
    update = trainer.state_for_sync()
    republisher.published()
    read: list = []
    errors: list = []

    def catch_up(engine: int) -> None:
        try:
            copy = republisher.lend(update, engine)
        except Superseded as error:  # came after the step began: told to wait for the next update
            errors.append(str(error))
            return
        try:
            read.append((copy.version, trainer.read(copy).tolist()))
        finally:
            republisher.give_back()

    def step() -> None:
        republisher.release(update)
        time.sleep(random.random() * 1e-3)
        republisher.begin_step()
        assert trainer.reading == 0, "a training step began while a catch-up reads"
        trainer.version = 2

    failures: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as error:  # a thread's failure, raised below in the test's thread
                failures.append(error)

        return run

    threads = [threading.Thread(target=guarded(lambda e=engine: catch_up(e))) for engine in (0, 1, 0, 1)]
    threads.append(threading.Thread(target=guarded(step)))
    random.shuffle(threads)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), f"seed {seed}: a thread hangs"
    if failures:
        raise AssertionError(f"seed {seed}") from failures[0]
    return trainer, read, errors


def test_no_copy_is_let_go_or_trained_over_while_a_catch_up_reads_it_under_random_schedules():
    """The release never frees what a catch-up reads (``Trainer.release_published`` asserts it), nor does a
    pack for another engine (``Trainer.pack_for``), the step waits for every catch-up, each catch-up reads its
    version's weights or is told to wait for the next update once the step began, and nothing is held at the
    end."""
    for seed in range(30):
        trainer, read, errors = race(seed)
        assert len(read) + len(errors) == 4, (seed, read, errors)
        assert all(entry == (1, [1.0] * 4) for entry in read), (seed, read)
        assert all("training its next step" in error for error in errors), (seed, errors)
        assert trainer.sync.held_bytes == 0 and trainer.reading == 0, seed


def test_a_catch_up_that_fails_while_applying_still_gives_the_copy_back():
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(10))
    update = released_update(trainer, republisher)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="engine died"):
            async with republisher.for_catch_up(update, 0) as copy:
                assert copy.version == 1 and trainer.sync.held_bytes == 16
                raise RuntimeError("engine died while applying")

    asyncio.run(main())
    assert trainer.sync.held_bytes == 0
    republisher.begin_step()  # nothing left reading: the step does not wait


def test_catch_ups_of_two_engines_take_turns_with_one_copy_each_packed_for_its_engine():
    """On Ray only the rank in a replaced engine's bundle packs (``pack_for``): engine 1's catch-up waits until
    the copy packed for engine 0 is let go, then gets its own; engine 0's second catch-up shares the first."""
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(10))
    update = released_update(trainer, republisher)
    first, again = republisher.lend(update, 0), republisher.lend(update, 0)
    assert first is again and trainer.packed_for == [0]
    lent: list = []
    waiting = threading.Thread(target=lambda: lent.append(republisher.lend(update, 1)))
    waiting.start()
    republisher.give_back()
    assert trainer.packed_for == [0] and trainer.sync.held_bytes == 16  # engine 0 still reads its copy
    republisher.give_back()
    waiting.join(timeout=10)
    assert not waiting.is_alive() and trainer.packed_for == [0, 1]
    (second,) = lent
    assert second is not first and is_released(first) and not is_released(second)
    republisher.give_back()
    assert trainer.sync.held_bytes == 0 and is_released(second)


def test_a_step_waits_for_a_reader_as_long_as_its_update_may_take_then_fails_by_name():
    """The wait is the reader's update deadline for the copy's bytes plus ``control_s``, not ``control_s``
    alone: a large model's catch-up may read for longer than ``runtime.control_timeout_s``."""
    trainer = Trainer()
    deadlines = CatchUpDeadlines(control_s=0.05, publish_s=10, read_s=lambda nbytes: nbytes / 1000)
    republisher = Republisher(trainer, deadlines)
    update = trainer.state_for_sync()
    republisher.lend(update, 0)  # a reader that never gives back (an engine that wedged)
    with pytest.raises(StillReading, match=r"a training step \(runtime.switch\) waited 0.066 s"):
        republisher.begin_step()
    with pytest.raises(StillReading, match="the release of v1 .* waited 0.066 s"):
        republisher.release(update)


def test_a_catch_up_cancelled_while_it_gives_back_still_gives_back():
    """The proxy closing cancels a recovery in the ``async with``'s exit: the give-back queued behind a busy
    executor still runs, or the reader stays counted and the next step waits out its deadline."""
    trainer = Trainer()
    republisher = Republisher(trainer, CatchUpDeadlines.within(10))
    update = released_update(trainer, republisher)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        applying, busy = asyncio.Event(), threading.Event()

        async def catch_up() -> None:
            async with republisher.for_catch_up(update, 0):
                applying.set()
                await asyncio.sleep(0)

        task = asyncio.ensure_future(catch_up())
        await applying.wait()
        blocker = loop.run_in_executor(None, busy.wait)  # the executor's one thread is taken
        await asyncio.sleep(0)  # the catch-up's exit queues its give-back behind it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        busy.set()
        await blocker
        await loop.run_in_executor(None, lambda: None)  # everything queued before this has run

    asyncio.run(main())
    assert trainer.sync.held_bytes == 0 and republisher._num_readers == 0
    republisher.begin_step()
