"""``runtime.switch`` on Ray with N pairs, the driver's part without Ray: an update every trainer rank published
reaches engine i's actor as rank i's blocks only (``RayEngineClient.index``), in apply and prefetch alike; each
send and how its call ended reaches the IPC ledger (``weight_sync.ipc_ledger``)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch
from ray.exceptions import RayActorError

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.runtime.errors import ActorCallError
from asyncrl.runtime.ray_runtime import RayEngineClient
from asyncrl.weight_sync.colocated import ColocatedSync, paired_update
from asyncrl.weight_sync.ipc_ledger import IpcLedger


class Method:
    """An actor method's ``.remote``: records the call, returns a finished reference (raising ``error``)."""

    def __init__(self, calls: list, error: Exception | None = None) -> None:
        self.calls = calls
        self.error = error

    def remote(self, *args):
        self.calls.append(args)
        done: Future = Future()
        if self.error is None:
            done.set_result(None)
        else:
            done.set_exception(self.error)
        return type("Ref", (), {"future": lambda _: done})()


class Handle:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list = []
        self.update_weights = self.prefetch_weights = Method(self.calls, error)


def published_pairs(num_ranks: int) -> tuple[list[ColocatedSync], list, object]:
    ranks = [ColocatedSync("cpu") for _ in range(num_ranks)]
    updates = [
        replace(update, handle=replace(update.handle, rank=rank))
        for rank, update in enumerate(sync.publish(1, {"w": torch.ones(4)}) for sync in ranks)
    ]
    return ranks, updates, paired_update(updates)


def test_each_engine_client_sends_its_actor_only_its_own_ranks_blocks():
    ranks, updates, paired = published_pairs(2)
    config = RuntimeConfig(type="local")
    for index in (0, 1):
        handle = Handle()
        client = RayEngineClient(handle, f"engine-{index}", config, index=index)
        asyncio.run(client.prefetch_weights(paired))
        asyncio.run(client.update_weights(paired, 1))
        (prefetched,), (applied, version) = handle.calls
        assert version == 1 and prefetched.handle is applied.handle is updates[index].handle
    for sync in ranks:
        sync.release()


def test_a_send_ends_in_the_ledger_when_the_engine_ended_its_call_and_stays_while_it_may_still_read():
    """Applied, or refused inside the engine: its mapping is gone. Its actor lost: it may still be reading
    until the engine is replaced (``RayEngineFactory.replace`` tells the ledger)."""
    ranks, updates, paired = published_pairs(3)
    ledger = IpcLedger()
    for rank, update in enumerate(updates):
        ledger.published(update.handle.key, rank)
    errors = [None, ValueError("manifest refused"), RayActorError()]
    for index, error in enumerate(errors):
        client = RayEngineClient(Handle(error), f"engine-{index}", RuntimeConfig(type="local"), index=index)
        client.ipc_ledger = ledger
        if error is None:
            asyncio.run(client.update_weights(paired, 1))
        else:
            with pytest.raises(ActorCallError if isinstance(error, RayActorError) else ValueError):
                asyncio.run(client.update_weights(paired, 1))
    ledger.retired(ledger.held())
    assert ledger.take_settled() == {0: [updates[0].handle.key], 1: [updates[1].handle.key]}
    ledger.reader_gone("engine-2")
    assert ledger.take_settled() == {2: [updates[2].handle.key]} and ledger.held() == []
    for sync in ranks:
        sync.release()
