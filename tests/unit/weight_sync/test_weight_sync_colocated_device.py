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
    blocks = [weakref.ref(block) for block in sync._live]
    storages = [weakref.ref(block.untyped_storage()) for block in sync._live]
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
