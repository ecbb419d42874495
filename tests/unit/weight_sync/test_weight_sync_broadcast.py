"""The broadcast transport's group: rank 0 sends buckets once, every other member receives them whole, and a
run config refuses it where it cannot work."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from asyncrl.config.run import load_run_config
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.trainer.distributed.process_group import free_port

BUCKETS = [
    {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)},
    {"c": torch.arange(4, dtype=torch.int64)},
]


def _member(rank: int, world_size: int, port: int, results) -> None:
    from asyncrl.weight_sync.broadcast import WeightGroup
    from asyncrl.weight_sync.flat import pack_state, unpack_state

    group = WeightGroup(
        host="127.0.0.1", port=port, rank=rank, world_size=world_size, device="cpu", timeout_s=60
    )
    for version in (5, 6):  # two updates through one group
        if rank == 0:
            group.send(pack_state(bucket, version) for bucket in BUCKETS)
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
