"""The colocated transport's CPU twin: shared-memory blocks handed to another process, copied in without a
second copy of the model on the engine side; released versions are refused by name."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from dataclasses import replace

import pytest
import torch
from tied_model import tiny_tied_qwen2

from asyncrl.models.loading import state_dict_for_sync
from asyncrl.weight_sync import WeightSyncError
from asyncrl.weight_sync.colocated import (
    SHM_DIR,
    ColocatedHandle,
    ColocatedSync,
    SharedBlock,
    SharedBucket,
    for_engine,
    mark_released,
    paired_update,
)
from asyncrl.weight_sync.flat import TensorEntry
from asyncrl.weight_sync.protocol import ManifestEntry, WeightUpdate
from asyncrl.weight_sync.transports import make_weight_sync
from bench.memory import PeakPrivateMemory

NUM_TENSORS, TENSOR_ELEMENTS = 16, 2**20  # 64 MiB of float32: far above the sampler's noise


def big_state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(TENSOR_ELEMENTS, generator=generator) for i in range(NUM_TENSORS)}


def digest(tensor: torch.Tensor) -> str:
    """The tensor's bytes, hashed: exact, where a sum's rounding depends on the process's thread count."""
    return hashlib.sha256(tensor.numpy().tobytes()).hexdigest()


def engine_process(update, conn) -> None:
    """Another process: its own weights (pages touched), then the update copied in from the mapping."""
    params = {name: torch.zeros(TENSOR_ELEMENTS) for name in update.names}
    with PeakPrivateMemory() as peak, torch.no_grad():
        for name, view in make_weight_sync(update.transport).receive(update):
            params[name].copy_(view)
    conn.send((peak.extra, {name: digest(t) for name, t in params.items()}))


def test_another_process_copies_the_weights_in_without_a_second_copy():
    state = big_state(0)
    sync = ColocatedSync("cpu")
    update = sync.publish(1, state)
    model_bytes = NUM_TENSORS * TENSOR_ELEMENTS * 4
    assert update.nbytes == model_bytes
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=engine_process, args=(update, sender))
    process.start()
    assert receiver.poll(120), "the engine process did not answer"
    extra, digests = receiver.recv()
    process.join(30)
    assert digests == {name: digest(t) for name, t in state.items()}
    assert extra < 0.25 * model_bytes, f"the engine side grew by {extra / 2**20:.0f} MiB"
    sync.release()


def test_a_round_trip_is_exact_with_tied_embeddings_and_dtypes_as_packed():
    model = tiny_tied_qwen2()
    state = state_dict_for_sync(model) | {"extra.bf16": torch.ones(3, dtype=torch.bfloat16)}
    sync = ColocatedSync("cpu")
    update = sync.publish(4, state)
    received = dict(make_weight_sync("colocated").receive(update))
    assert received.keys() == state.keys()
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
    assert update.nbytes < sum(t.numel() * t.element_size() for t in state.values())  # tied matrix once
    sync.release()


def test_a_released_version_is_refused_by_name_never_read_stale():
    sync = ColocatedSync("cpu")
    old = sync.publish(1, {"w": torch.ones(4)})
    new = sync.publish(2, {"w": torch.full((4,), 2.0)})  # publishing v2 releases v1
    with pytest.raises(WeightSyncError, match="v1: its shared memory .* is gone"):
        dict(make_weight_sync("colocated").receive(old))
    assert torch.equal(dict(make_weight_sync("colocated").receive(new))["w"], torch.full((4,), 2.0))
    sync.release()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a process that sees no GPU")
def test_a_cuda_ipc_handle_in_a_process_without_cuda_is_refused_by_name():
    """The CUDA path behind the same interface (another process on Ray): where it cannot open, it says why."""
    block = SharedBlock(kind="cuda_ipc", dtype="float32", numel=4, ref=(), local=(os.getpid() + 1, 0))
    bucket = SharedBucket(
        manifest=(TensorEntry(name="w", dtype="float32", shape=(4,), offset=0),), blocks=(block,)
    )
    update = WeightUpdate(
        version=3,
        transport="colocated",
        manifest=(ManifestEntry(name="w", dtype="float32", shape=(4,)),),
        handle=ColocatedHandle(version=3, buckets=(bucket,)),
    )
    with pytest.raises(
        WeightSyncError, match="v3: the trainer sent a CUDA IPC handle, but this engine's process"
    ):
        dict(make_weight_sync("colocated").receive(update))


def test_the_builtin_engine_takes_a_colocated_update_through_update_weights():
    from asyncrl.config.engine import EngineConfig
    from asyncrl.engine import make_engine
    from asyncrl.models.loading import load_model_and_tokenizer

    trainer, tokenizer = load_model_and_tokenizer("", "float32", "cpu")
    served, _ = load_model_and_tokenizer("", "float32", "cpu")
    engine = make_engine(served, tokenizer, EngineConfig(), 1).core
    with torch.no_grad():
        for param in trainer.parameters():
            param.add_(0.01)
    sync = ColocatedSync("cpu")
    engine.update_weights(sync.publish(1, state_dict_for_sync(trainer)), 1)
    for (name, got), want in zip(
        engine.model.state_dict().items(), trainer.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name
    sync.release()


def test_every_ranks_update_is_paired_and_each_engine_reads_its_own_ranks_blocks():
    """``runtime.switch`` on Ray with N pairs: each rank packs the full weights for the engine in its bundle;
    engine i reads rank i's blocks, and a mismatched or misplaced publication is refused by name."""
    state = {"w": torch.arange(6, dtype=torch.float32), "b": torch.ones(2)}
    ranks = [ColocatedSync("cpu"), ColocatedSync("cpu")]
    updates = [
        replace(update, handle=replace(update.handle, rank=rank))
        for rank, update in enumerate(sync.publish(3, state) for sync in ranks)
    ]
    paired = paired_update(updates)
    assert (paired.version, paired.transport, paired.nbytes) == (3, "colocated", updates[0].nbytes)
    with pytest.raises(WeightSyncError, match="its own rank's"):
        make_weight_sync("colocated").receive(paired)  # every rank's blocks: never read whole
    for engine in (0, 1):
        own = for_engine(paired, engine)
        assert own.handle is updates[engine].handle
        received = dict(make_weight_sync("colocated").receive(own))
        assert all(torch.equal(received[name], tensor) for name, tensor in state.items())
    assert {b.ref for b in for_engine(paired, 0).handle.buckets[0].blocks}.isdisjoint(
        b.ref for b in for_engine(paired, 1).handle.buckets[0].blocks
    )
    with pytest.raises(WeightSyncError, match="engine 2 has no trainer rank"):
        for_engine(paired, 2)
    assert for_engine(updates[0], 5) is updates[0]  # one rank's update: every engine reads it
    assert paired_update(updates[:1]) is updates[0]
    with pytest.raises(WeightSyncError, match="entry 0 is not rank 0"):
        paired_update(updates[::-1])
    stale = replace(updates[1], version=2)
    with pytest.raises(WeightSyncError, match="rank 1 published v2"):
        paired_update([updates[0], stale])
    for sync in ranks:
        sync.release()


def test_a_version_released_once_applied_is_gone_and_refused_by_name_and_the_next_is_exact():
    """``runtime.switch`` lets go of the packed copy once every engine applied it (``mark_released``, then
    ``release``): its memory is gone, a late reader is refused before it opens a handle, the next version is
    packed afresh and read bit for bit."""
    ranks = [ColocatedSync("cpu"), ColocatedSync("cpu")]
    first = {"w": torch.arange(6, dtype=torch.float32), "h": torch.ones(3, dtype=torch.bfloat16)}
    updates = [
        replace(update, handle=replace(update.handle, rank=rank))
        for rank, update in enumerate(sync.publish(1, first) for sync in ranks)
    ]
    paired = paired_update(updates)
    names = [b.ref for u in updates for bucket in u.handle.buckets for b in bucket.blocks]
    assert [sync.held_bytes for sync in ranks] == [paired.nbytes] * 2
    mark_released(paired)
    assert [sync.release() for sync in ranks] == [paired.nbytes] * 2
    assert [sync.held_bytes for sync in ranks] == [0, 0] and not any(sync._live for sync in ranks)
    assert not [name for name in names if os.path.exists(f"{SHM_DIR}/{name}")]
    for engine in (0, 1):  # the driver refuses before any handle leaves it
        with pytest.raises(WeightSyncError, match="v1: the trainer released its colocated blocks"):
            for_engine(paired, engine)
    single = ranks[0].publish(2, first)
    mark_released(single)
    with pytest.raises(WeightSyncError, match="v2: the trainer released"):
        dict(make_weight_sync("colocated").receive(single))
    second = {name: tensor + 1 for name, tensor in first.items()}
    update = ranks[1].publish(3, second)
    received = dict(make_weight_sync("colocated").receive(update))
    assert all(torch.equal(received[name], tensor) for name, tensor in second.items())
    for sync in ranks:
        sync.release()
