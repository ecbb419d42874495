"""The colocated transport's device blocks: engines in the trainer's own process (the inline runtime) get no
CUDA IPC handle, since a handle nobody opens pins its block in torch's sent-data list for good; engines in
another process (Ray) do. Without a GPU the device path runs on the ``meta`` device (the same code but the
allocation's bytes); the CUDA test (scripts/gpu-smoke.sh's unit section) counts the allocator's bytes."""

from __future__ import annotations

import gc
import os
import weakref
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing.reductions as reductions

from asyncrl.config.run import load_run_config
from asyncrl.runtime.inline import make_inline_weight_sync
from asyncrl.weight_sync import WeightSyncError
from asyncrl.weight_sync.colocated import ColocatedSync
from asyncrl.weight_sync.transports import make_weight_sync

SWITCHED = [
    "output_dir=/tmp/x",
    "runtime.switch.enabled=true",
    "controller.mode=sync",
    "buffer.async_ratio=0",
]


def weights() -> dict[str, torch.Tensor]:
    embed = torch.randn(8, 4)
    return {"embed": embed, "lm_head": embed, "norm": torch.ones(4, dtype=torch.bfloat16)}


@pytest.fixture
def reduced(monkeypatch) -> list[torch.Tensor]:
    """Every tensor ``reduce_tensor`` (the CUDA IPC handle's maker) is called on, in order."""
    calls: list[torch.Tensor] = []
    original = reductions.reduce_tensor

    def spy(tensor: torch.Tensor):
        calls.append(tensor)
        return original(tensor)

    monkeypatch.setattr(reductions, "reduce_tensor", spy)
    return calls


def test_the_inline_switch_packs_device_blocks_without_ipc_handles(reduced):
    config = load_run_config(None, SWITCHED)
    sync = make_inline_weight_sync(config, "meta")
    assert isinstance(sync, ColocatedSync) and not sync.ipc
    update = sync.publish(1, weights())
    assert [block.kind for bucket in update.handle.buckets for block in bucket.blocks] == ["cuda_local"] * 2
    received = dict(make_weight_sync("colocated").receive(update))  # the engine reads the block itself
    assert received["embed"].shape == (8, 4) and received["lm_head"].shape == (8, 4)
    sync.release()
    assert reduced == []


def test_the_ray_side_of_the_switch_packs_device_blocks_with_ipc_handles(reduced):
    """Trainer ranks on Ray (``trainer_group``) take the config's options without ``in_process``."""
    config = load_run_config(None, [*SWITCHED, "runtime.type=local"])
    options = config.weight_sync.transport_options("colocated", config.output_dir, "meta")
    sync = make_weight_sync("colocated", **options)
    update = sync.publish(1, weights())
    blocks = [block for bucket in update.handle.buckets for block in bucket.blocks]
    assert [block.kind for block in blocks] == ["cuda_ipc"] * 2
    assert len(reduced) == 2 and all(block.ref is not None for block in blocks)
    sync.release()


@pytest.mark.parametrize("ipc", [False, True])
def test_released_device_blocks_are_freed_by_this_process(ipc):
    """Nothing on the trainer side (the in-process registry, the handle) keeps a released block's memory."""
    sync = ColocatedSync("meta", ipc=ipc)
    update = sync.publish(1, weights())
    held = [block for owners in sync._live.values() for block in owners]
    blocks = [weakref.ref(block) for block in held]
    storages = [weakref.ref(block.untyped_storage()) for block in held]
    del held
    assert len(blocks) == 2 and all(ref() is not None for ref in blocks)
    sync.release()
    gc.collect()
    assert [ref() for ref in blocks + storages] == [None] * 4
    with pytest.raises(WeightSyncError, match="v1: its CUDA block was released"):
        dict(make_weight_sync("colocated").receive(update))


def test_a_block_without_an_ipc_handle_is_refused_by_name_in_another_process():
    sync = ColocatedSync("meta", ipc=False)
    update = sync.publish(3, weights())
    bucket = update.handle.buckets[0]
    elsewhere = tuple(replace(block, local=(os.getpid() + 1, block.local[1])) for block in bucket.blocks)
    moved = replace(update, handle=replace(update.handle, buckets=(replace(bucket, blocks=elsewhere),)))
    with pytest.raises(WeightSyncError, match="v3: its device blocks were packed without CUDA IPC handles"):
        dict(make_weight_sync("colocated").receive(moved))
    sync.release()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts a CUDA allocator's bytes")
def test_inline_publications_on_cuda_leave_allocated_memory_flat():
    """Publish, read and release in one process, again and again: the allocator's bytes come back to where
    they were after each release (with an IPC handle, torch kept every released block: 3.4 GB a step at
    Qwen3-1.7B)."""
    device = torch.device("cuda")
    state = {f"w{i}": torch.randn(2**20, device=device) for i in range(4)}  # 16 MiB
    sync = ColocatedSync(device, ipc=False)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    for version in range(1, 6):
        update = sync.publish(version, state)
        received = dict(make_weight_sync("colocated").receive(update))
        assert torch.equal(received["w0"], state["w0"])
        assert torch.cuda.memory_allocated(device) == before + update.nbytes
        del received
        assert sync.release() == update.nbytes
        torch.cuda.synchronize(device)
        assert torch.cuda.memory_allocated(device) == before, f"v{version} left its blocks allocated"


@pytest.fixture
def fake_ipc(monkeypatch) -> list:
    """Device blocks on ``meta`` get a CUDA-style IPC handle with a reference counter (``rebuild_cuda_tensor``'s
    arguments, counter at 11 and 12), and taking a counter back is recorded: the producer's settling without a
    GPU (the CUDA test below runs the real one)."""
    import asyncrl.weight_sync.colocated as colocated

    released: list = []

    def reduce(tensor: torch.Tensor):
        args = [None] * 15
        args[7], args[11], args[12] = b"block", b"/torch_counters", id(tensor)
        return reductions.rebuild_cuda_tensor, tuple(args)

    monkeypatch.setattr(reductions, "reduce_tensor", reduce)
    monkeypatch.setattr(colocated, "release_ipc_counter", released.append)
    return released


def test_a_settled_publisher_keeps_released_ipc_blocks_until_settled_then_takes_each_counter_back(fake_ipc):
    """Released, a block with a handle stays referenced (an engine may still read it: the ledger decides);
    settled, each counter is taken back once and the blocks are gone."""
    sync = ColocatedSync("meta", ipc=True, settled=True)
    first = sync.publish(1, weights())
    held = [weakref.ref(block) for owners in sync._live.values() for block in owners]
    counters = [id(ref()) for ref in held]  # the fake handle's counter slot: the block's id
    assert sync.unsettled() == [first.handle.key] and fake_ipc == []
    second = sync.publish(2, weights())  # supersedes: v1 parked, not dropped
    gc.collect()
    assert all(ref() is not None for ref in held) and sync.parked_bytes == first.nbytes
    assert sync.settle([first.handle.key]) == 2 and [c.offset for c in fake_ipc] == counters
    gc.collect()
    assert [ref() for ref in held] == [None, None] and sync.unsettled() == [second.handle.key]
    assert sync.settle([first.handle.key]) == 0 and len(fake_ipc) == 2  # settled once only
    assert sync.settle([second.handle.key]) == 2  # a held key is released first
    assert sync.unsettled() == [] and sync.held_bytes == sync.parked_bytes == 0


def test_an_unsettled_publisher_drops_released_blocks_into_torchs_keeping(fake_ipc):
    """Without a ledger (``settled`` off) nothing is tracked: the blocks go at release, as torch keeps them."""
    sync = ColocatedSync("meta", ipc=True)
    sync.publish(1, weights())
    held = [weakref.ref(block) for owners in sync._live.values() for block in owners]
    sync.release()
    gc.collect()
    assert [ref() for ref in held] == [None, None] and sync.unsettled() == [] and fake_ipc == []


def test_the_ray_trainer_ranks_publisher_is_settled_by_the_driver_and_the_inline_one_is_not():
    config = load_run_config(None, [*SWITCHED, "runtime.type=local"])
    assert config.weight_sync.transport_options("colocated", "/tmp/x", "cuda")["settled"] is True
    inline = config.weight_sync.transport_options("colocated", "/tmp/x", "cuda", in_process=True)
    assert inline["settled"] is False and inline["ipc"] is False


def host_bytes(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {name: tensor.cpu().numpy().tobytes() for name, tensor in tensors.items()}


def open_and_let_go(conn) -> None:
    """An engine process: opens each update it is sent (CUDA IPC), copies it out, lets go, answers the bytes."""
    while (update := conn.recv()) is not None:
        received = dict(make_weight_sync("colocated").receive(update))
        copied = host_bytes(received)
        del received
        torch.cuda.synchronize()
        conn.send(copied)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's CUDA IPC reference counting")
def test_on_cuda_a_never_opened_block_is_pinned_until_settled_and_an_opened_one_is_freed_either_way():
    """The facts the ledger stands on, on a GPU: a handle nobody opens pins its block after the producer drops
    it, ``ipc_collect`` included; taking its counter back frees it. Settling a block another process opened and
    let go (its counter then goes below 0) frees it as well; nothing is left allocated."""
    import multiprocessing

    import asyncrl.weight_sync.colocated as colocated

    device = torch.device("cuda")
    state = {f"w{i}": torch.randn(2**20, device=device) for i in range(4)}  # 16 MiB
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)

    unsettled = ColocatedSync(device, ipc=True)  # torch's keeping alone
    update = unsettled.publish(1, state)
    assert unsettled.release() == update.nbytes
    torch.cuda.ipc_collect()
    assert torch.cuda.memory_allocated(device) == before + update.nbytes  # pinned: never opened
    for block in (b for bucket in update.handle.buckets for b in bucket.blocks):
        colocated.release_ipc_counter(colocated.IpcCounter(block.ref[11], block.ref[12]))
    torch.cuda.ipc_collect()
    assert torch.cuda.memory_allocated(device) == before

    sync = ColocatedSync(device, ipc=True, settled=True)
    never = sync.publish(2, state)
    sync.release()
    assert torch.cuda.memory_allocated(device) == before + never.nbytes  # parked until settled
    assert sync.settle([never.handle.key]) == 1
    assert torch.cuda.memory_allocated(device) == before

    context = multiprocessing.get_context("spawn")
    conn, theirs = context.Pipe()
    engine = context.Process(target=open_and_let_go, args=(theirs,), daemon=True)
    engine.start()
    try:
        opened = sync.publish(3, state)
        conn.send(opened)
        assert conn.poll(120), "the engine process did not answer within 120 s"
        assert conn.recv() == host_bytes(state)
        sync.release()
        assert sync.settle([opened.handle.key]) == 1  # its counter: 1, the engine's 0, now -1
        assert torch.cuda.memory_allocated(device) == before
    finally:
        conn.send(None)
        engine.join(30)
