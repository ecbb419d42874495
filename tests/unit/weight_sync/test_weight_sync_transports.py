"""Every WeightSync transport: exact round trips, refusals before any read, tied embeddings, the factory."""

from __future__ import annotations

import pytest
import torch
from tied_model import tiny_tied_qwen2

from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.models.loading import state_dict_for_sync
from asyncrl.proxy.worker import snapshot_named_tensors
from asyncrl.weight_sync import (
    FlatBufferSync,
    InProcessSync,
    WeightSyncError,
    make_weight_sync,
)
from asyncrl.weight_sync.receiver import expected_shapes, receive_checked


class CountingStore:
    """A fake object store: ``put`` keeps the value under a key, ``get`` counts reads."""

    def __init__(self) -> None:
        self.values: dict[int, object] = {}
        self.num_gets = 0

    def put(self, value: object) -> int:
        key = len(self.values)
        self.values[key] = value
        return key

    def get(self, key: int) -> object:
        self.num_gets += 1
        return self.values[key]


def transports(store: CountingStore):
    return [InProcessSync(), FlatBufferSync(put=store.put, get=store.get)]


@pytest.mark.parametrize("index", [0, 1])
def test_round_trip_is_exact_and_owns_its_memory(index):
    store = CountingStore()
    sync = transports(store)[index]
    state = {"a.weight": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    update = sync.publish(3, state)
    state["a.weight"].add_(100)  # the trainer keeps training in place
    received = dict(sync.receive(update))
    assert update.version == 3 and update.transport == sync.name
    assert [(e.name, e.dtype, e.shape) for e in update.manifest] == [
        ("a.weight", "float32", (2, 3)),
        ("b", "bfloat16", (4,)),
    ]
    assert torch.equal(received["a.weight"], torch.arange(6.0).reshape(2, 3))
    assert received["b"].dtype == torch.bfloat16 and torch.equal(
        received["b"], torch.ones(4, dtype=torch.bfloat16)
    )


def test_tied_embeddings_are_expected_under_both_names_and_received_checked():
    model = tiny_tied_qwen2()
    shapes = expected_shapes(model)
    assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == (50, 32)
    store = CountingStore()
    sync = FlatBufferSync(put=store.put, get=store.get)
    update = sync.publish(1, state_dict_for_sync(model))
    received = dict(receive_checked(sync, update, serving_version=0, shapes=shapes))
    assert torch.equal(received["lm_head.weight"], model.lm_head.weight)


def test_an_untied_manifest_without_the_output_layer_is_refused():
    model = tiny_tied_qwen2()
    state = {name: p.detach() for name, p in model.named_parameters()}  # drops lm_head.weight (tied)
    update = InProcessSync().publish(1, state)
    with pytest.raises(WeightSyncError, match=r"missing tensor\(s\) \['lm_head.weight'\]"):
        receive_checked(InProcessSync(), update, serving_version=0, shapes=expected_shapes(model))


@pytest.mark.parametrize(
    ("state", "serving_version", "message"),
    [
        ({"w": torch.zeros(2, 2)}, 5, "weight update v4 is older than the served v5; refused"),
        ({"w": torch.zeros(2, 3)}, 0, r"tensor 'w' has shape \(2, 3\), the model has \(2, 2\)"),
        ({"w": torch.zeros(2, 2), "x": torch.zeros(1)}, 0, "unknown tensor 'x'"),
        ({}, 0, r"missing tensor\(s\) \['w'\]"),
    ],
)
def test_a_stale_or_mismatched_update_is_refused_before_any_read(state, serving_version, message):
    store = CountingStore()
    sync = FlatBufferSync(put=store.put, get=store.get)
    update = sync.publish(4, state)
    with pytest.raises(WeightSyncError, match=message):
        receive_checked(sync, update, serving_version=serving_version, shapes={"w": (2, 2)})
    assert store.num_gets == 0


def test_a_payload_for_another_transport_or_version_is_refused():
    store = CountingStore()
    flat_sync = FlatBufferSync(put=store.put, get=store.get)
    with pytest.raises(WeightSyncError, match="travels by 'in_process', not 'object_store'"):
        flat_sync.receive(InProcessSync().publish(1, {"w": torch.zeros(1)}))
    update = flat_sync.publish(2, {"w": torch.zeros(1)})
    relabelled = flat_sync.update_of(
        [store.values[update.handle[0]]], handles=flat_sync.publish(3, {"w": torch.zeros(1)}).handle
    )
    with pytest.raises(WeightSyncError, match="weight update v2: its buffers hold version 3"):
        list(flat_sync.receive(relabelled))


def test_make_weight_sync_switches_on_the_transport_the_runtime_carries():
    assert isinstance(make_weight_sync(WeightSyncConfig().transport_for("inline")), InProcessSync)
    assert isinstance(make_weight_sync(WeightSyncConfig().transport_for("local")), FlatBufferSync)
    with pytest.raises(
        ValueError, match="weight_sync.type must be one of 'auto', 'in_process', 'object_store'"
    ):
        WeightSyncConfig(type="nccl")
    with pytest.raises(
        ValueError, match="weight_sync.type='in_process' cannot carry weights in runtime.type='local'"
    ):
        WeightSyncConfig(type="in_process").transport_for("local")
    with pytest.raises(ValueError, match="unknown weight-sync transport 'disk'"):
        make_weight_sync("disk")


def test_the_proxy_passes_a_weight_update_through_its_drain_snapshot():
    update = FlatBufferSync().publish(1, {"w": torch.zeros(1)})
    assert snapshot_named_tensors(update) is update


def test_buckets_are_placed_one_by_one_and_read_back_in_order():
    store = CountingStore()
    sync = FlatBufferSync(put=store.put, get=store.get)
    placed_before = []

    def buckets():
        for index in range(3):
            placed_before.append(len(store.values))  # each bucket is placed before the next is made
            yield {f"w{index}": torch.full((2,), float(index))}

    update = sync.publish_buckets(7, buckets())
    assert placed_before == [0, 1, 2] and len(update.handle) == 3
    assert update.names == ["w0", "w1", "w2"]
    received = dict(
        receive_checked(sync, update, serving_version=6, shapes={f"w{i}": (2,) for i in range(3)})
    )
    assert {name: t.tolist() for name, t in received.items()} == {f"w{i}": [float(i)] * 2 for i in range(3)}
    with pytest.raises(WeightSyncError, match="needs >= 1 bucket"):
        sync.publish_buckets(8, [])


@pytest.mark.parametrize("index", [0, 1])
def test_an_update_counts_the_bytes_it_ships_with_a_tied_matrix_once(index):
    """``WeightUpdate.nbytes`` is the ``weight_sync/bytes`` metric: what the transport moved, not the names."""
    sync = transports(CountingStore())[index]
    state = state_dict_for_sync(tiny_tied_qwen2())
    distinct = {t.data_ptr(): t.numel() * t.element_size() for t in state.values()}
    update = sync.publish(1, state)
    assert update.nbytes == sum(distinct.values())
    assert update.nbytes < sum(t.numel() * t.element_size() for t in state.values())
