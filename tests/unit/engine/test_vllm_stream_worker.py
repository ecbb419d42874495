"""A broadcast into vLLM's worker without vLLM, streamed (``weight_sync.broadcast_apply: streamed``) or
staged: the real client and the real ``worker_main.Worker`` over a pipe, the worker's ``_stream`` / ``_stage``
run on a fake vLLM worker over a real gloo group of three (trainer rank 0, this engine, and a built-in receiver
standing for the others).

The fake model keeps each bucket's views until the next bucket loads, as vLLM's layerwise reload keeps the
weights of a layer still collecting, so the held count must follow the buckets' storage, not their tensors.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import threading
import time
from multiprocessing import Pipe
from types import SimpleNamespace

import pytest
import torch
from vllm_pipe import FakeProcess, PipedWorker

from asyncrl.engine.vllm import worker_main
from asyncrl.engine.vllm.client import VLLMEngineClient, VLLMWorkerError
from asyncrl.trainer.distributed.process_group import free_port
from asyncrl.types import Request, SamplingParams
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.buckets import group_into_buckets
from asyncrl.weight_sync.flat import pack_state
from asyncrl.weight_sync.protocol import WeightSyncError
from asyncrl.weight_sync.transports import update_of_buckets

BUCKET_BYTES = 600


class FakeModel:
    """vLLM's model as ``_load_views`` feeds it: each load's tensors copied, its views kept until the next."""

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}
        self.collecting: list[torch.Tensor] = []

    def load_weights(self, named) -> None:
        named = list(named)
        self.loaded.update((name, view.clone()) for name, view in named)
        self.collecting = [view for _, view in named]


class FakeVLLM:
    """vLLM's ``AsyncLLM`` as ``op_join_group`` / ``op_stream`` use it; ``collective_rpc`` runs the function on
    a fake vLLM worker on a thread, as vLLM's engine core runs it off the worker's loop."""

    def __init__(self) -> None:
        self.model = FakeModel()
        model_runner = SimpleNamespace(
            get_model=lambda: self.model,
            reload_weights=lambda weights_iterator: self.model.load_weights(weights_iterator),
        )
        self.vllm_worker = SimpleNamespace(model_runner=model_runner)
        self.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1))
        self.paused = False
        self.paused_while_streaming: list[bool] = []
        self.weight_version = "0"

    async def collective_rpc(self, function, args=()):
        if function is worker_main._stream:
            self.paused_while_streaming.append(self.paused)
        return [await asyncio.to_thread(function, self.vllm_worker, *args)]

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.paused = True

    async def resume_generation(self) -> None:
        self.paused = False

    async def reset_prefix_cache(self) -> None:
        pass

    async def update_weight_version(self, version: str) -> None:
        self.weight_version = version


def weights(more_layers: int = 0) -> dict[str, torch.Tensor]:
    """A small model's weights; ``more_layers`` further MLP layers for an update of many buckets."""
    torch.manual_seed(0)
    named = {
        "model.embed_tokens.weight": torch.randn(16, 8),
        "model.layers.0.mlp.weight": torch.randn(8, 8),
        "model.layers.0.mlp.bias": torch.randn(8),
        "model.layers.1.mlp.weight": torch.randn(8, 8),
        "model.norm.weight": torch.randn(8),
        "lm_head.weight": torch.randn(16, 8),
    }
    named.update({f"model.layers.{2 + i}.mlp.weight": torch.randn(8, 8) for i in range(more_layers)})
    return named


class Group(PipedWorker):
    """Trainer rank 0, the streamed vLLM engine (rank 1, through its client) and a built-in receiver (rank 2)."""

    def __init__(self, monkeypatch, apply: str = "streamed", served: dict | None = None) -> None:
        self.begun: list[str] = []
        monkeypatch.setattr(worker_main, "_load_begin", lambda worker: self.begun.append("begin"))
        monkeypatch.setattr(worker_main, "_load_commit", lambda worker: self.begun.append("commit"))
        served = weights() if served is None else served
        super().__init__(FakeVLLM(), {n: tuple(t.shape) for n, t in served.items()})
        self.client.broadcast_apply = apply
        self.client.weight_sync_timeout_s = 30.0

    async def form(self) -> None:
        port = free_port()
        options = {"host": "127.0.0.1", "port": port, "world_size": 3, "device": "cpu", "timeout_s": 30}
        trainer = asyncio.ensure_future(asyncio.to_thread(WeightGroup, rank=0, **options))
        other = asyncio.ensure_future(asyncio.to_thread(WeightGroup, rank=2, **options))
        await self.client.join_weight_group(
            host="127.0.0.1", port=port, rank=1, world_size=3, device="cpu", timeout_s=30
        )
        self.trainer, self.other = await trainer, await other

    async def broadcast(self, buckets: list[list[tuple[str, torch.Tensor]]], version: int):
        """One publish (every member receiving, rank 0 sending), then the proxy's ``update_weights`` on this
        engine: what the other member received, and this engine's failure (None when it applied)."""
        streamed = asyncio.ensure_future(self.client.stage_weights())
        received = asyncio.ensure_future(asyncio.to_thread(self.other.receive))
        await asyncio.to_thread(self.trainer.send, [pack_state(bucket, version) for bucket in buckets])
        assert await streamed == version
        flats = [pack_state(bucket, version).without_buffers() for bucket in buckets]
        try:
            await self.client.update_weights(update_of_buckets(flats, "broadcast", None), version)
        except WeightSyncError as error:
            return await received, error
        return await received, None


def sent_by_other(received) -> dict[str, torch.Tensor]:
    from asyncrl.weight_sync.flat import unpack_state

    return {name: t for flat in received for name, t in unpack_state(flat).items()}


def wait_for_gloo_to_let_go(monkeypatch) -> None:
    """Make each receive return only once gloo's worker threads hold no reference to its tensor. A gloo
    thread drops the finished collective's tensor after the receiver's ``wait`` returned (seen here: its
    tensor's use count 4 right after ``wait`` for about one buffer in ten, 1 a moment later), and on a loaded
    machine that moment came after the next bucket arrived: three buckets counted alive, though the worker
    held two. The bound is about the worker's own references, so the gloo twin's lag is taken out of it."""
    real = worker_main._broadcast_into

    def broadcast_into(member, tensor) -> None:
        real(member, tensor)
        deadline = time.monotonic() + 10
        while tensor._use_count() > 1:  # the caller's reference only
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"gloo kept a reference to a received tensor: use count {tensor._use_count()}"
                )
            time.sleep(0.001)

    monkeypatch.setattr(worker_main, "_broadcast_into", broadcast_into)


def test_each_bucket_loads_as_it_arrives_bit_for_bit_paused_and_holding_at_most_two_buckets(monkeypatch):
    """Python's cyclic collector is off while it streams: a finished bucket must go by reference counting
    alone, or ``held_peak`` counts a third."""
    sent = weights()
    buckets = list(group_into_buckets(sent, BUCKET_BYTES))
    group = Group(monkeypatch)
    wait_for_gloo_to_let_go(monkeypatch)

    async def scenario():
        await group.form()
        return await group.broadcast(buckets, 2)

    gc.disable()
    try:
        received, failure = asyncio.run(scenario())
    finally:
        gc.enable()
        group.close()
    assert failure is None and len(buckets) >= 3
    loaded = group.engine.model.loaded
    assert loaded.keys() == sent.keys() and all(torch.equal(loaded[n], t) for n, t in sent.items())
    assert group.client.version == 2 and group.engine.weight_version == "2" and group.worker.version == 2
    assert group.begun == ["begin", "commit"]
    assert group.engine.paused_while_streaming == [True] and not group.engine.paused  # resumed after
    report = group.client.last_stream
    # the model keeps the last bucket's views while the next arrives: two buckets, never three
    assert report["largest_bucket"] < report["held_peak"] <= 2 * report["largest_bucket"]
    assert sent_by_other(received).keys() == sent.keys()


def test_a_bucket_refused_after_one_loaded_tears_the_engine_and_the_group_stays_in_step(monkeypatch):
    sent = weights()
    buckets = list(group_into_buckets(sent, BUCKET_BYTES))
    name = buckets[1][0][0]
    wrong = [buckets[0], [(name, torch.ones(3)), *buckets[1][1:]], *buckets[2:]]
    group = Group(monkeypatch)
    request = Request(request_id="r", prompt_token_ids=[1], sampling=SamplingParams(max_new_tokens=2))

    async def scenario():
        await group.form()
        refused = await group.broadcast(wrong, 1)
        with pytest.raises(VLLMWorkerError, match="weights are torn"):
            await group.client.generate(request)
        return refused, await group.broadcast(buckets, 2)

    try:
        (received, refused), (received_next, refused_next) = asyncio.run(scenario())
    finally:
        group.close()
    assert refused is not None and f"tensor {name!r} (float32 [3]) does not match" in str(refused)
    assert group.worker.torn is not None and group.engine.paused  # never resumed on mixed weights
    assert group.client.version == 0 and group.engine.weight_version == "0"
    # the other member got both whole updates: the refused stream was drained, the collective kept in step
    assert sent_by_other(received).keys() == sent.keys() == sent_by_other(received_next).keys()
    assert refused_next is not None and "weights are torn" in str(refused_next)


def test_a_refused_first_bucket_loads_nothing_and_the_old_weights_keep_serving(monkeypatch):
    sent = weights()
    buckets = list(group_into_buckets(sent, BUCKET_BYTES))
    name = buckets[0][0][0]
    wrong = [[(name, torch.ones(3)), *buckets[0][1:]], *buckets[1:]]
    group = Group(monkeypatch)

    async def scenario():
        await group.form()
        refused = await group.broadcast(wrong, 1)
        return refused, await group.broadcast(buckets, 2)

    try:
        (_, refused), (_, applied) = asyncio.run(scenario())
    finally:
        group.close()
    assert refused is not None and f"tensor {name!r}" in str(refused)
    assert applied is None and group.worker.torn is None and group.client.version == 2
    assert group.begun == ["begin", "commit"]  # the refused stream never began vLLM's reload
    assert not group.engine.paused


def test_the_engine_actor_hands_the_runs_broadcast_apply_to_its_vllm_client(monkeypatch):
    """The run's one decision (``RunConfig.broadcast_apply``) reaches vLLM's client as it reaches the built-in
    engine, and a streamed vLLM engine reports what streamed, so a replacement that missed a stream catches up."""
    from asyncrl.config.engine import EngineConfig
    from asyncrl.config.model import ModelConfig
    from asyncrl.runtime.ray_runtime import EngineActor

    def for_model(model, engine, *, seed=0):
        return VLLMEngineClient(FakeProcess(), None, {})

    monkeypatch.setattr(VLLMEngineClient, "for_model", staticmethod(for_model))
    monkeypatch.setattr(VLLMEngineClient, "_read_loop", lambda self: None)
    vllm = EngineConfig(backend="vllm")
    for apply in ("staged", "streamed"):
        actor = EngineActor(ModelConfig(device="cpu"), vllm, 1, broadcast_apply=apply)
        assert actor.engine.broadcast_apply == apply and actor.streamed is None
    actor.engine.streamed_version, actor.engine.streamed_failed = 3, {4: WeightSyncError("refused")}
    assert asyncio.run(actor.staged_versions()) == [3, 4]
    staged = EngineActor(ModelConfig(device="cpu"), vllm, 1, broadcast_apply="staged")
    assert asyncio.run(staged.staged_versions()) is None  # vLLM's worker keeps its staged versions


def test_a_stream_past_its_deadline_tears_the_engine_since_what_loaded_is_unknown():
    worker = worker_main.Worker(None, argparse.Namespace())
    engine = worker.engine = FakeVLLM()

    async def never_answers(function, args=()):
        await asyncio.Event().wait()

    engine.collective_rpc = never_answers
    sent: list[dict] = []
    worker.send = sent.append
    asyncio.run(worker.run_command({"op": "stream", "call": 0, "timeout_s": 0.05, "shapes": []}))
    assert "TimeoutError" in sent[-1]["error"]
    assert worker.torn is not None and "did not finish" in worker.torn and engine.paused


@pytest.mark.parametrize("pinned", [True, False], ids=["cuda-pinned", "pageable"])
def test_a_staged_update_waits_in_host_memory_and_each_buffer_leaves_the_receive_device_as_it_arrives(
    monkeypatch, pinned
):
    """vLLM's worker stages a broadcast as the built-in engine does: each buffer received on the group's device
    is copied into host memory (pinned where the engine is on CUDA, the client deciding with
    ``broadcast.pin_staged``) right after its collective, before anything else is received, and the stage
    keeps no reference to it, so that device holds the buffer in flight, never the update; the apply then loads
    every weight bit for bit. On gloo the receive device is host memory too, so the test tells the two apart by
    storage: every received buffer is gone once staged, and every staged buffer is a host allocation of the
    stage's own (pinned ones recorded through ``torch.empty``, which cannot pin without CUDA).

    What the receive device holds at once is counted too (``_HeldBytes``), but bounded loosely: gloo's two
    worker threads each drop their reference to a finished collective's buffer only after the receiver's
    ``wait`` returned (seen here: one buffer or two, over runs), so up to two finished buffers may still be
    alive beside the one in flight. The bound checked is that the whole update never is."""
    from asyncrl.engine.vllm import client as client_module

    monkeypatch.setattr(client_module, "pin_staged", lambda device: pinned)  # as on a CUDA engine
    real_empty, pinned_storages = torch.empty, set()

    def empty(*args, pin_memory: bool = False, **kwargs):
        tensor = real_empty(*args, **kwargs)
        if pin_memory:
            pinned_storages.add(tensor.untyped_storage().data_ptr())
        return tensor

    monkeypatch.setattr(torch, "empty", empty)
    events: list[tuple[str, int]] = []
    real_broadcast_into, real_to_host = worker_main._broadcast_into, worker_main._to_host

    def broadcast_into(member, tensor):
        real_broadcast_into(member, tensor)
        events.append(("received", tensor.untyped_storage().data_ptr()))

    def to_host(received, *, pin):
        events.append(("to host", received.untyped_storage().data_ptr()))
        return real_to_host(received, pin=pin)

    monkeypatch.setattr(worker_main, "_broadcast_into", broadcast_into)
    monkeypatch.setattr(worker_main, "_to_host", to_host)
    stages: list[worker_main._HeldBytes] = []

    class Held(worker_main._HeldBytes):
        def __init__(self) -> None:
            super().__init__()
            stages.append(self)

    monkeypatch.setattr(worker_main, "_HeldBytes", Held)
    sent = weights(more_layers=6)
    buckets = list(group_into_buckets(sent, BUCKET_BYTES))
    group = Group(monkeypatch, apply="staged", served=sent)
    staged: list[dict[str, torch.Tensor]] = []

    async def scenario():
        await group.form()
        stage = asyncio.ensure_future(group.client.stage_weights())
        received = asyncio.ensure_future(asyncio.to_thread(group.other.receive))
        await asyncio.to_thread(group.trainer.send, [pack_state(bucket, 1) for bucket in buckets])
        assert await stage == 1 and len(await received) == len(buckets)
        staged.extend(buffers for _, buffers in group.engine.vllm_worker.asyncrl_weights["staged"][1])
        flats = [pack_state(bucket, 1).without_buffers() for bucket in buckets]
        await group.client.update_weights(update_of_buckets(flats, "broadcast", None), 1)

    try:
        asyncio.run(scenario())
    finally:
        group.close()
    staged_buffers = [b for buffers in staged for b in buffers.values()]
    assert len(staged) == len(buckets) >= 5
    # each buffer goes to host right after its own collective, before anything else is received
    copies = [i for i, (what, _) in enumerate(events) if what == "to host"]
    assert len(copies) == len(staged_buffers)
    assert all(events[i - 1] == ("received", events[i][1]) for i in copies)
    # the stage kept none of them on the receive device, and it never held the whole update there
    [held] = stages
    largest_buffer = max(b.nbytes for b in staged_buffers)
    staged_bytes = sum(b.nbytes for b in staged_buffers)
    assert largest_buffer <= held.peak <= 3 * largest_buffer < staged_bytes and held.held == 0
    storages = {b.untyped_storage().data_ptr() for b in staged_buffers}
    assert storages == pinned_storages if pinned else not pinned_storages
    loaded = group.engine.model.loaded
    assert loaded.keys() == sent.keys() and all(torch.equal(loaded[n], t) for n, t in sent.items())
    assert group.client.version == 1 and group.engine.weight_version == "1"
    assert group.engine.vllm_worker.asyncrl_weights["staged"] == {}  # dropped once applied


@pytest.mark.parametrize(
    ("device", "cuda", "pinned"),
    [("cuda:0", True, True), ("cpu", True, False), ("cuda:0", False, False)],
)
def test_the_client_asks_vllms_worker_to_pin_its_staging_where_the_engine_is_on_cuda(
    monkeypatch, device, cuda, pinned
):
    """The rule is the built-in engine's (``broadcast.pin_staged``): the worker cannot import it, so the
    client sends its answer with the join."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    ours, theirs = Pipe()
    client = VLLMEngineClient(FakeProcess(), ours, {})
    joined: list[dict] = []

    def worker() -> None:
        joined.append(theirs.recv())
        theirs.send({"event": "result", "call": joined[0]["call"], "result": None})

    answering = threading.Thread(target=worker)
    answering.start()
    asyncio.run(
        client.join_weight_group(host="127.0.0.1", port=1, rank=1, world_size=2, device=device, timeout_s=5)
    )
    answering.join(10)
    theirs.close()
    assert joined[0]["op"] == "join_group" and joined[0]["pin_staged"] is pinned
