"""The colocated IPC ledger (``weight_sync.ipc_ledger``): every publication's blocks are let go for good on every
path (acknowledged, reader replaced, superseded, shut down), never while a live engine may still read them.

The random-schedule test runs the ledger against a model of torch's CUDA IPC reference counting
(``torch/csrc/CudaIPCTypes.cpp``): a block's counter starts at 1; a process that opened the handle takes 1 back
when its mapping dies, a killed one never does; the producer's dropped block is freed once its counter is <= 0
(at the drop, or at a later collect), else kept in torch's limbo. The producer (``ColocatedSync`` with
``settled``) drops a block only at ``settle``, which takes 1 back first: dropping it at its release instead
would free it under a second reader once the first had taken the counter back (the schedules find that)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from asyncrl.weight_sync import WeightSyncError
from asyncrl.weight_sync.ipc_ledger import IpcLedger


def test_a_publication_every_engine_applied_is_settled_when_the_trainer_lets_go():
    ledger = IpcLedger()
    ledger.published("a", 0)
    ledger.sent("a", "engine-0")
    ledger.finished("a", "engine-0")
    assert ledger.take_settled() == {} and ledger.held() == ["a"]  # still held: the latest copy
    ledger.retired(["a"])
    assert ledger.take_settled() == {0: ["a"]} and ledger.held() == []


def test_a_publication_never_sent_is_settled_when_superseded():
    ledger = IpcLedger()
    ledger.published("a", 1)
    ledger.retired(ledger.held())
    assert ledger.take_settled() == {1: ["a"]}


def test_an_engine_still_reading_keeps_the_blocks_until_it_finishes_or_is_replaced():
    ledger = IpcLedger()
    for key, reader in (("a", "engine-0"), ("b", "engine-1")):
        ledger.published(key, int(reader[-1]))
        ledger.sent(key, reader)
    ledger.retired(["a", "b"])
    assert ledger.take_settled() == {}  # both may still be mapped
    ledger.finished("a", "engine-0")
    ledger.reader_gone("engine-1")  # killed by its replacement, mid-read
    assert ledger.take_settled() == {0: ["a"], 1: ["b"]} and ledger.held() == []


def test_two_calls_of_one_engine_with_one_publication_keep_it_until_both_end():
    ledger = IpcLedger()
    ledger.published("a", 0)
    ledger.sent("a", "engine-0")
    ledger.sent("a", "engine-0")  # a catch-up beside a regular update
    ledger.retired(["a"])
    ledger.finished("a", "engine-0")
    assert ledger.take_settled() == {}
    ledger.finished("a", "engine-0")
    assert ledger.take_settled() == {0: ["a"]}


def test_a_send_to_a_replaced_engine_holds_nothing():
    ledger = IpcLedger()
    ledger.published("a", 0)
    ledger.reader_gone("engine-0")
    ledger.sent("a", "engine-0")
    ledger.retired(["a"])
    assert ledger.take_settled() == {0: ["a"]}


def test_shutdown_settles_every_publication_readers_or_not():
    ledger = IpcLedger()
    ledger.published("a", 0)
    ledger.published("b", 1)
    ledger.sent("b", "engine-1")
    assert ledger.drain() == {0: ["a"], 1: ["b"]} and ledger.held() == []


def test_a_superseded_publication_can_still_be_read_until_settled_and_never_after():
    """A send racing the next publish (the proxy draining the older update) keeps the parked blocks; once
    settled, a send is refused by name: its blocks may be freed."""
    ledger = IpcLedger()
    ledger.published("a", 0)
    with pytest.raises(WeightSyncError, match="publication a: published twice"):
        ledger.published("a", 0)
    ledger.sent("a", "engine-0")
    ledger.retired(["a"])  # superseded while engine-0 reads it
    ledger.sent("a", "engine-1")
    ledger.finished("a", "engine-0")
    assert ledger.take_settled() == {}
    ledger.finished("a", "engine-1")
    assert ledger.take_settled() == {0: ["a"]}
    with pytest.raises(WeightSyncError, match="sent to engine engine-0, but it is not held"):
        ledger.sent("a", "engine-0")


# ----------------------------------------------------------------------------------------- random schedules


@dataclass
class Block:
    """One rank's blocks of one publication, as torch keeps them on the producer."""

    counter: int = 1
    dropped: bool = False
    freed: bool = False

    def collect(self) -> None:
        if self.dropped and self.counter <= 0:
            self.freed = True


@dataclass
class Engine:
    """One engine process: the handles sent to it whose call has not ended, and the ones it mapped."""

    name: str
    pending: list[str] = field(default_factory=list)
    """Sent, not opened yet, one entry per call (its call may run late, even after the driver stopped
    waiting)."""
    mapped: list[str] = field(default_factory=list)
    abandoned: set[str] = field(default_factory=set)
    """Sends whose call the driver stopped waiting for (timeout): the engine may still open them."""


class Run:
    """The driver (ledger, Lease), ``num_ranks`` trainer ranks (each one block per publication, torch's counter
    modelled) and one engine per rank, which the proxy may replace."""

    def __init__(self, num_ranks: int, rng: random.Random) -> None:
        self.rng = rng
        self.ledger = IpcLedger()
        self.blocks: dict[str, Block] = {}
        self.rank_of: dict[str, int] = {}
        self.held: list[str] = []  # the keys of the latest publication until released (the Lease)
        self.engines = [Engine(f"engine-{i}") for i in range(num_ranks)]
        self.num_keys = self.num_starts = 0

    # the driver's calls that reach the ranks, each carrying the settled keys (runtime.trainer_group)
    def publish(self) -> None:
        self.release()
        for rank in range(len(self.engines)):
            self.num_keys += 1
            key = f"k{self.num_keys}"
            self.blocks[key], self.rank_of[key] = Block(), rank
            self.ledger.published(key, rank)
            self.held.append(key)

    def release(self) -> None:
        """ColocatedSync.release parks the blocks (kept referenced); the settled keys reach the ranks."""
        self.ledger.retired(self.ledger.held())
        self.held = []
        self._settle(self.ledger.take_settled())

    def shutdown(self) -> None:
        for index in range(len(self.engines)):  # RayParts.close: engines first
            self.kill(index, replace=False)
        self._settle(self.ledger.drain())

    def _settle(self, settled: dict[int, list[str]]) -> None:
        """ColocatedSync.settle: the counter taken back, the block dropped, torch's limbo collected."""
        for rank, keys in settled.items():
            for key in keys:
                assert self.rank_of[key] == rank
                self.blocks[key].counter -= 1
                self.blocks[key].dropped = True
        for block in self.blocks.values():
            block.collect()

    # the engines
    def send(self, index: int) -> None:
        """The proxy sends engine ``index`` one of its rank's publications: the held one, a superseded one it
        still drains, or one already settled, which the ledger refuses by name (the Lease refuses a released
        one before the ledger sees it; not modelled)."""
        keys = [key for key in self.blocks if self.rank_of[key] == index]
        key, engine = self.rng.choice(keys), self.engines[index]
        if key in self.ledger.held():
            self.ledger.sent(key, engine.name)
            engine.pending.append(key)
        else:
            with pytest.raises(WeightSyncError, match="not held"):
                self.ledger.sent(key, engine.name)

    def open(self, index: int) -> None:
        engine = self.engines[index]
        if engine.pending:
            key = engine.pending.pop(self.rng.randrange(len(engine.pending)))
            assert not self.blocks[key].freed, f"{engine.name} opened {key}'s freed block"
            engine.mapped.append(key)

    def finish(self, index: int) -> None:
        """The engine's call ends (applied, or refused inside the engine): its mapping dies, counter back."""
        engine = self.engines[index]
        if engine.mapped:
            key = engine.mapped.pop(self.rng.randrange(len(engine.mapped)))
            self.blocks[key].counter -= 1
            self.blocks[key].collect()
            if key not in engine.abandoned:
                self.ledger.finished(key, engine.name)

    def time_out(self, index: int) -> None:
        """The driver stops waiting for the engine's call (it may still run): no ledger call."""
        engine = self.engines[index]
        engine.abandoned |= {*engine.pending, *engine.mapped}

    def kill(self, index: int, replace: bool = True) -> None:
        """The proxy replaces the engine (RayEngineFactory.replace): killed, so it never takes a counter back."""
        self.ledger.reader_gone(self.engines[index].name)
        if replace:
            self.num_starts += 1
            self.engines[index] = Engine(f"engine-{index}-restart-{self.num_starts}")

    def check(self) -> None:
        """No block is freed while a live engine may read it (mapped, or sent and not yet opened)."""
        for engine in self.engines:
            for key in engine.pending + engine.mapped:
                assert not self.blocks[key].freed, f"{key} freed while {engine.name} may read it"

    def check_settled(self) -> None:
        """Right after a call reached the ranks, no let-go block outlives its last live reader, as the driver
        can know it: a call it stopped waiting for counts until its engine is replaced (module docstring of
        ``weight_sync.ipc_ledger``)."""
        readers = {key for e in self.engines for key in {*e.pending, *e.mapped, *e.abandoned}}
        for key, block in self.blocks.items():
            if key not in self.held and key not in readers:
                assert block.freed, f"{key} kept (counter {block.counter}) with no engine able to read it"


@pytest.mark.parametrize("seed", range(300))
def test_every_block_is_freed_on_every_path_and_never_under_a_live_reader(seed):
    rng = random.Random(seed)
    run = Run(num_ranks=rng.choice([1, 2, 3]), rng=rng)
    run.publish()
    engine_steps = ("send", "open", "finish", "time_out", "kill")
    for _ in range(rng.randint(5, 60)):
        action = rng.choice(["publish", "release", *engine_steps, *engine_steps])
        if action in ("publish", "release"):
            getattr(run, action)()
            run.check_settled()
        else:
            getattr(run, action)(rng.randrange(len(run.engines)))
        run.check()
    run.shutdown()
    assert run.ledger.held() == []
    assert [key for key, block in run.blocks.items() if not block.freed] == []
