"""The broadcast transport's group: rank 0 sends buckets once, every other member receives them whole, and a
run config refuses it where it cannot work."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from asyncrl.config.run import load_run_config
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.trainer.distributed.process_group import free_port
from asyncrl.weight_sync.broadcast import header_of, pack_on_device, pin_staged, staging_device
from asyncrl.weight_sync.flat import pack_state, unpack_state

BUCKETS = [
    {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)},
    {"c": torch.arange(4, dtype=torch.int64)},
]


def _member(rank: int, world_size: int, port: int, results) -> None:
    from asyncrl.weight_sync.broadcast import WeightGroup, pack_on_device
    from asyncrl.weight_sync.flat import pack_state, unpack_state

    group = WeightGroup(
        host="127.0.0.1", port=port, rank=rank, world_size=world_size, device="cpu", timeout_s=60
    )
    for version in (5, 6):  # two updates through one group
        if rank == 0 and version == 5:  # host buckets (numpy)
            group.send(pack_state(bucket, version) for bucket in BUCKETS)
        elif rank == 0:  # buckets packed on the group's device: the same bytes on the wire
            group.send(pack_on_device(list(b.items()), version, group.staging_device) for b in BUCKETS)
        else:
            got = [
                (f.version, {k: v.float().tolist() for k, v in unpack_state(f).items()})
                for f in group.receive()
            ]
            results.put((rank, version, got))


def test_every_engine_receives_every_bucket_of_every_update():
    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), free_port()
    members = [context.Process(target=_member, args=(rank, 3, port, results)) for rank in range(3)]
    for member in members:
        member.start()
    received = sorted(results.get(timeout=120) for _ in range(4))
    for member in members:
        member.join(timeout=30)
    want = [{k: v.float().tolist() for k, v in bucket.items()} for bucket in BUCKETS]
    assert [(rank, version) for rank, version, _ in received] == [(1, 5), (1, 6), (2, 5), (2, 6)]
    for _, version, got in received:
        assert got == [(version, bucket) for bucket in want]


def test_broadcast_is_a_ray_transport_and_keeps_engine_recovery():
    assert WeightSyncConfig(type="broadcast").transport_for("local") == "broadcast"
    assert WeightSyncConfig().transport_for("cluster") == "object_store"
    with pytest.raises(ValueError, match="cannot carry weights in runtime.type='inline'"):
        WeightSyncConfig(type="broadcast").transport_for("inline")
    config = load_run_config(None, ["runtime.type=local", "weight_sync.type=broadcast"])
    assert config.proxy.max_engine_restarts > 0  # a replaced engine joins a re-formed group


def test_a_device_bucket_has_the_wire_layout_of_a_host_bucket_and_is_packed_once():
    weight = torch.arange(6.0).reshape(2, 3)
    named = [("embed", weight), ("lm_head", weight), ("b", torch.ones(3, dtype=torch.bfloat16))]
    bucket = pack_on_device(named, 7, torch.device("cpu"))
    assert header_of(bucket) == header_of(pack_state(named, 7))
    assert {d: b.dtype for d, b in bucket.buffers.items()} == {
        "float32": torch.uint8,
        "bfloat16": torch.uint8,
    }
    assert bucket.buffers["float32"].numel() == 6 * 4  # the tied pair is stored once
    host = unpack_state(bucket.to_host())
    assert torch.equal(host["lm_head"], weight) and torch.equal(host["b"], named[2][1])
    assert bucket.without_buffers().payload_bytes == 6 * 4 + 3 * 2


def test_nccl_stages_on_the_gpu_and_gloo_in_host_memory():
    assert staging_device("nccl", "cuda:1") == torch.device("cuda:1")
    assert staging_device("gloo", "cuda:0") == torch.device("cpu")
    with pytest.raises(ValueError, match="backend 'nccl' needs a cuda device"):
        staging_device("nccl", "cpu")
    with pytest.raises(ValueError, match="backend 'mpi' is not one of"):
        staging_device("mpi", "cpu")


def test_a_staged_update_lands_in_pinned_host_memory_only_for_an_engine_on_cuda(monkeypatch):
    """Pinned memory speeds the host → GPU copy at apply; for a CPU engine it would only lock memory."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pin_staged(torch.device("cuda", 0)) and not pin_staged(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not pin_staged(torch.device("cuda", 0))


def test_the_sender_holds_at_most_two_packed_buckets_at_once():
    """Rank 0 packs lazily: while bucket k+1 is packed only bucket k may still be alive (no whole-model copy)."""
    import weakref

    from asyncrl.weight_sync.broadcast import WeightGroup

    group = WeightGroup.__new__(WeightGroup)  # rank 0 without a process group: broadcasts are recorded
    group.rank, group.staging_device = 0, torch.device("cpu")
    sent: list[int] = []
    group._broadcast = lambda tensor, into=False: sent.append(tensor.numel())
    live, peak = set(), []

    def packed():
        for index in range(6):
            bucket = pack_on_device(
                [(f"w{index}", torch.full((256,), float(index)))], 1, group.staging_device
            )
            live.add(index)
            weakref.finalize(bucket, live.discard, index)
            peak.append(len(live))
            yield bucket

    group.send(packed())
    assert sent.count(256 * 4) == 6  # every bucket's bytes went out
    assert max(peak) <= 2


class _Replay:
    """A receiver's process group that replays what a sender broadcast (recorded in order): a host tensor is
    filled with the recorded bytes, a ``meta`` tensor (a stand-in for a GPU: no host copy of it can exist) only
    checked for size, as a collective writes in place on whatever device the tensor is."""

    def __init__(self, sent: list[torch.Tensor]) -> None:
        self.sent = sent
        self.filled: list[torch.Tensor] = []

    def broadcast(self, tensors, options):
        (tensor,), recorded = tensors, self.sent.pop(0)
        assert tensor.dtype == recorded.dtype and tensor.shape == recorded.shape
        if tensor.device.type != "meta":
            tensor.copy_(recorded)
        self.filled.append(tensor)
        return type("Done", (), {"wait": lambda self, timeout: True})()


def _loopback(buckets, version: int, staging: torch.device):
    """A sender and a receiver ``WeightGroup`` without a process group: the headers the sender sends are handed
    over as they are, the buffers it broadcasts are replayed into the receiver's own ``_broadcast``, whose
    buckets are staged on ``staging``."""
    from asyncrl.weight_sync.broadcast import HeldBytes, WeightGroup

    sender = WeightGroup.__new__(WeightGroup)
    sender.rank, sender.staging_device, headers, sent = 0, torch.device("cpu"), [], []
    sender._send_header = headers.append
    sender._broadcast = lambda tensor, into=False: sent.append(tensor.clone())
    sender.send_packed(buckets, version)
    receiver = WeightGroup.__new__(WeightGroup)
    receiver.rank, receiver.world_size, receiver.timeout = 1, 2, 60
    receiver.device = receiver.staging_device = staging
    receiver.pin_staged, receiver.held, receiver._group = False, HeldBytes(), _Replay(sent)
    receiver._receive_header = lambda: headers.pop(0)
    return receiver


def test_a_streamed_bucket_stays_on_the_staging_device_and_is_applied_from_views_of_it(monkeypatch):
    """Staging that is not host memory (``meta`` standing in for NCCL's GPU): each bucket reaches ``apply`` as
    the very tensors the collective filled, on that device, and nothing is copied to host on the way."""
    receiver = _loopback([list(bucket.items()) for bucket in BUCKETS], 3, torch.device("meta"))

    def host_copy(tensor, *args, **kwargs):
        raise AssertionError(f"a host copy of a {tensor.device} tensor on the streamed path")

    monkeypatch.setattr(torch.Tensor, "cpu", host_copy)
    applied = []

    def apply(flat) -> None:
        assert all(isinstance(b, torch.Tensor) and b.device.type == "meta" for b in flat.buffers.values())
        # the collective filled the bucket's own buffers: no staging copy in between
        assert all(any(b is t for t in receiver._group.filled) for b in flat.buffers.values())
        receiver._group.filled.clear()  # hold nothing past this bucket, as an engine does
        views = unpack_state(flat)
        applied.append({name: (v.device.type, v.dtype, tuple(v.shape)) for name, v in views.items()})

    assert receiver.receive_streamed(apply) == 3
    assert applied == [
        {name: ("meta", t.dtype, tuple(t.shape)) for name, t in bucket.items()} for bucket in BUCKETS
    ]
    assert receiver.held.peak == max(sum(t.nbytes for t in b.values()) for b in BUCKETS)  # one bucket at once
