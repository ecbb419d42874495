"""Every weight-sync wait ends by its deadline with a named error, transport by transport (the audit of
issue 32): a broadcast whose sender never sends, an object-store bucket that never arrives, a vLLM worker
that never answers; the delta and colocated transports never wait (a missing version is an error at once)."""

from __future__ import annotations

import asyncio
import threading
import time
from multiprocessing import Pipe

import pytest
import torch

from asyncrl.trainer.distributed.process_group import free_port
from asyncrl.weight_sync import WeightSyncError
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.delta import DeltaHandle
from asyncrl.weight_sync.protocol import ManifestEntry, WeightSyncTimeout, WeightUpdate
from asyncrl.weight_sync.transports import make_weight_sync

DEADLINE_S = 1.5


def test_a_broadcast_receive_with_no_sender_ends_by_its_deadline():
    """Rank 0 joins and then never sends (a trainer stuck or gone mid-broadcast)."""
    port, groups = free_port("127.0.0.1"), {}

    def join(rank: int) -> None:
        groups[rank] = WeightGroup(
            host="127.0.0.1", port=port, rank=rank, world_size=2, device="cpu", timeout_s=DEADLINE_S
        )

    joining = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in joining:
        thread.start()
    for thread in joining:
        thread.join(30)
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match="weight group rank 1/2: a broadcast: no progress"):
        groups[1].receive()
    assert time.monotonic() - started < DEADLINE_S + 10


def test_joining_a_group_that_never_forms_ends_by_its_deadline():
    """Rank 1 of 2 alone: rank 0 (the trainer's store) never shows up."""
    started = time.monotonic()
    with pytest.raises((WeightSyncTimeout, WeightSyncError), match="joining the weight group"):
        WeightGroup(
            host="127.0.0.1",
            port=free_port("127.0.0.1"),
            rank=1,
            world_size=2,
            device="cpu",
            timeout_s=DEADLINE_S,
        )
    assert time.monotonic() - started < DEADLINE_S + 10


def test_an_object_store_bucket_that_never_arrives_ends_by_its_deadline():
    from asyncrl.config.engine import EngineConfig
    from asyncrl.config.model import ModelConfig
    from asyncrl.runtime.ray_runtime import EngineActor

    actor = EngineActor(ModelConfig(device="cpu"), EngineConfig(), 1, weight_sync_timeout_s=DEADLINE_S)
    manifest = tuple(
        ManifestEntry(name=n, dtype="float32", shape=tuple(p.shape))
        for n, p in actor.engine.core.model.state_dict().items()
    )

    async def never_arrives() -> None:
        never = asyncio.get_running_loop().create_future()
        update = WeightUpdate(version=1, transport="object_store", manifest=manifest, handle=(never,))
        await actor.update_weights(update, 1)

    with pytest.raises(WeightSyncTimeout, match="object-store buckets did not arrive within 1.5 s"):
        asyncio.run(never_arrives())
    assert actor.engine.version == 0  # nothing applied


class SilentProcess:
    pid = 0

    def poll(self) -> None:
        return None


def test_a_vllm_worker_that_never_answers_a_weight_update_ends_by_its_deadline():
    """The pipe into vLLM's worker: the client bounds every weight operation (and sends the deadline along)."""
    from asyncrl.engine.vllm.client import VLLMEngineClient

    ours, theirs = Pipe()
    shapes = {"w": (2,)}
    client = VLLMEngineClient(SilentProcess(), ours, shapes)
    client.weight_sync_timeout_s = DEADLINE_S
    with pytest.raises(WeightSyncTimeout, match="update_begin not answered within 1.5 s"):
        asyncio.run(client.update_weights({"w": torch.ones(2)}, 1))
    assert theirs.recv()["timeout_s"] == DEADLINE_S  # the worker bounds its collective_rpc by it too
    with pytest.raises(WeightSyncTimeout, match="stage not answered"):
        asyncio.run(client.stage_weights())
    theirs.close()


def test_delta_and_colocated_never_wait_for_a_missing_version(tmp_path):
    manifest = (ManifestEntry(name="w", dtype="float32", shape=(2,)),)
    missing = WeightUpdate(
        version=3, transport="delta", manifest=manifest, handle=DeltaHandle(root=str(tmp_path), version=3)
    )
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match="no delta chain and no full snapshot"):
        make_weight_sync("delta").fetch(missing, 2)
    from asyncrl.weight_sync.colocated import ColocatedSync

    sync = ColocatedSync("cpu")
    gone = sync.publish(1, {"w": torch.ones(2)})
    sync.release()
    with pytest.raises(WeightSyncError, match="is gone"):
        dict(make_weight_sync("colocated").receive(gone))
    assert time.monotonic() - started < 5


def test_joining_a_weight_group_sends_vllms_worker_every_field_it_reads():
    """The client's join message carries each argument of the worker's ``_join_group`` under its name, and the
    call's own deadline apart from the group's: both were once sent as ``timeout_s``, a TypeError found only
    in vLLM's environment."""
    import inspect

    from asyncrl.engine.vllm import worker_main
    from asyncrl.engine.vllm.client import VLLMEngineClient

    ours, theirs = Pipe()
    client = VLLMEngineClient(SilentProcess(), ours, {"w": (2,)})

    async def join_and_read() -> dict:
        joining = asyncio.ensure_future(
            client.join_weight_group(
                host="127.0.0.1", port=1, rank=1, world_size=2, device="cpu", timeout_s=DEADLINE_S
            )
        )
        if not await asyncio.to_thread(theirs.poll, 10):
            await joining  # it sent nothing: raise what stopped it
        joining.cancel()
        return theirs.recv()

    message = asyncio.run(join_and_read())
    read_by_worker = list(inspect.signature(worker_main._join_group).parameters)[1:]  # after the worker
    assert set(read_by_worker) <= set(message), set(read_by_worker) - set(message)
    assert message["group_timeout_s"] == DEADLINE_S and message["timeout_s"] > DEADLINE_S
    theirs.close()
