"""``runtime.republish``: a replaced engine's catch-up under ``runtime.switch`` reads the held copy, or one packed
again of the same version, never one let go while it reads, never weights of another version (invariants:
the module's docstring), over real shared-memory blocks of the colocated transport."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable

import pytest
import torch

from asyncrl.runtime.republish import Republisher
from asyncrl.weight_sync.colocated import ColocatedSync, is_released
from asyncrl.weight_sync.protocol import WeightSyncError


class Trainer:
    """The facade a ``Republisher`` wraps: publishes ``{"w": [version] * 4}`` through the colocated transport;
    ``reading`` counts catch-ups reading a copy now, which a release must never see above 0."""

    def __init__(self, version: int = 1) -> None:
        self.version = version
        self.sync = ColocatedSync()
        self.num_packed = 0
        self.reading = 0
        self.lock = threading.Lock()

    def weights(self) -> torch.Tensor:
        return torch.full((4,), float(self.version))

    def state_for_sync(self):
        self.num_packed += 1
        return self.sync.publish(self.version, {"w": self.weights()})

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
    republisher = Republisher(trainer, timeout_s=10)
    held = trainer.state_for_sync()
    assert republisher.lend(held) is held and trainer.num_packed == 1
    republisher.give_back()
    assert not is_released(held) and trainer.sync.held_bytes == 16  # still the engines' until applied

    assert republisher.release(held) == 16 and trainer.sync.held_bytes == 0  # every engine applied it
    fresh = republisher.lend(held)
    again = republisher.lend(held)  # a second replacement catching up meanwhile shares the copy
    assert fresh is again and fresh is not held and fresh.version == held.version == 1
    assert trainer.num_packed == 2 and torch.equal(trainer.read(fresh), torch.full((4,), 1.0))
    republisher.give_back()
    assert trainer.sync.held_bytes == 16 and not is_released(fresh)  # one still reads it
    republisher.give_back()
    assert trainer.sync.held_bytes == 0 and is_released(fresh)  # the last one done lets it go
    with pytest.raises(WeightSyncError, match="v1: the trainer released"):
        trainer.sync.receive(fresh)


@pytest.mark.parametrize("moved", ["training", "published"])
def test_a_released_update_is_refused_by_name_once_the_trainer_moved_on(moved):
    trainer = Trainer()
    republisher = Republisher(trainer, timeout_s=10)
    update = released_update(trainer, republisher)
    republisher.begin_step()
    if moved == "published":
        trainer.version = 2
        trainer.state_for_sync()
        republisher.published()
    now = "v1, training its next step" if moved == "training" else "v2"
    with pytest.raises(WeightSyncError, match=f"v1: the trainer let go .* now {now}, so a replaced engine"):
        republisher.lend(update)
    assert trainer.num_packed == (1 if moved == "training" else 2)


def test_a_copy_packed_as_another_version_is_let_go_and_refused():
    trainer = Trainer()
    republisher = Republisher(trainer, timeout_s=10)
    update = released_update(trainer, republisher)
    publish = trainer.state_for_sync

    def moved_on_meanwhile():
        trainer.version = 2  # the trainer's version changed after the check (a facade that misreports it)
        return publish()

    trainer.state_for_sync = moved_on_meanwhile
    with pytest.raises(WeightSyncError, match="v1: packed again as v2"):
        republisher.lend(update)
    assert trainer.sync.held_bytes == 0


def race(seed: int) -> tuple[Trainer, list, list]:
    """Four catch-ups of a held update race its release and the next training step, in a random order."""
    random.seed(seed)
    trainer = Trainer()
    republisher = Republisher(trainer, timeout_s=30)
    update = trainer.state_for_sync()
    republisher.published()
    read: list = []
    errors: list = []

    def catch_up() -> None:
        try:
            copy = republisher.lend(update)
        except WeightSyncError as error:  # came after the step began: refused by name
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

    threads = [threading.Thread(target=guarded(catch_up)) for _ in range(4)]
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
    """The release never frees what a catch-up reads (``Trainer.release_published`` asserts it), the step
    waits for every catch-up, each catch-up reads its version's weights or is refused by name once the step
    began, and nothing is held at the end."""
    for seed in range(30):
        trainer, read, errors = race(seed)
        assert len(read) + len(errors) == 4, (seed, read, errors)
        assert all(entry == (1, [1.0] * 4) for entry in read), (seed, read)
        assert all("training its next step" in error for error in errors), (seed, errors)
        assert trainer.sync.held_bytes == 0 and trainer.reading == 0, seed


def test_a_catch_up_that_fails_while_applying_still_gives_the_copy_back():
    trainer = Trainer()
    republisher = Republisher(trainer, timeout_s=10)
    update = released_update(trainer, republisher)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="engine died"):
            async with republisher.for_catch_up(update) as copy:
                assert copy.version == 1 and trainer.sync.held_bytes == 16
                raise RuntimeError("engine died while applying")

    asyncio.run(main())
    assert trainer.sync.held_bytes == 0
    republisher.begin_step()  # nothing left reading: the step does not wait
