"""``runtime.switch`` on Ray with N pairs, the driver's part without Ray: an update every trainer rank published
reaches engine i's actor as rank i's blocks only (``RayEngineClient.index``), in apply and prefetch alike."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import replace

import torch

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.runtime.ray_runtime import RayEngineClient
from asyncrl.weight_sync.colocated import ColocatedSync, paired_update


class Method:
    """An actor method's ``.remote``: records the call, returns a finished reference."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def remote(self, *args):
        self.calls.append(args)
        done: Future = Future()
        done.set_result(None)
        return type("Ref", (), {"future": lambda _: done})()


class Handle:
    def __init__(self) -> None:
        self.calls: list = []
        self.update_weights = self.prefetch_weights = Method(self.calls)


def test_each_engine_client_sends_its_actor_only_its_own_ranks_blocks():
    ranks = [ColocatedSync("cpu"), ColocatedSync("cpu")]
    updates = [
        replace(update, handle=replace(update.handle, rank=rank))
        for rank, update in enumerate(sync.publish(1, {"w": torch.ones(4)}) for sync in ranks)
    ]
    paired = paired_update(updates)
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
