"""pack_state / unpack_state: exact round trips, zero-copy views, shared memory stored once, corrupt manifests."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from tied_model import tiny_tied_qwen2

from asyncrl.models.loading import state_dict_for_sync
from asyncrl.weight_sync import (
    DeviceBucket,
    FlatWeights,
    TensorEntry,
    pack_state,
    unpack_state,
)


def mixed_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        "a.weight": torch.randn(3, 4, generator=gen),
        "b.weight": torch.randn(5, generator=gen).to(torch.bfloat16),
        "c.bias": torch.randn(2, 2, generator=gen),
        "d.scale": torch.randn(7, generator=gen).to(torch.bfloat16),
        "e.step": torch.tensor(3, dtype=torch.int64),
        "f.empty": torch.zeros(0, 3),
    }


def test_round_trip_is_exact_for_mixed_dtypes_and_layout_is_dense():
    state = mixed_state()
    flat = pack_state(state, version=7)
    assert flat.version == 7
    assert flat.names == list(state)
    assert {d: len(b) for d, b in flat.buffers.items()} == {"float32": 16, "bfloat16": 12, "int64": 1}
    assert [(e.dtype, e.offset) for e in flat.manifest] == [
        ("float32", 0),
        ("bfloat16", 0),
        ("float32", 12),
        ("bfloat16", 5),
        ("int64", 0),
        ("float32", 16),
    ]
    assert flat.nbytes == 16 * 4 + 12 * 2 + 8
    out = unpack_state(flat)
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor), name


def test_unpacked_tensors_view_the_buffers_without_copying():
    flat = pack_state(mixed_state(), version=0)
    out = unpack_state(flat)
    flat.buffers["float32"][0] = np.float32(2.5).view(np.uint32)
    assert out["a.weight"][0, 0].item() == 2.5


def test_pack_copies_so_later_training_does_not_leak_into_the_snapshot():
    state = mixed_state()
    flat = pack_state(state, version=0)
    state["a.weight"].add_(1.0)
    assert not torch.equal(unpack_state(flat)["a.weight"], state["a.weight"])


def test_tied_model_round_trips_with_lm_head_and_stores_shared_memory_once():
    model = tiny_tied_qwen2()
    views = state_dict_for_sync(model)  # detached views: lm_head.weight is the embedding matrix itself
    assert views["lm_head.weight"].data_ptr() == views["model.embed_tokens.weight"].data_ptr()
    flat = pack_state(views, version=3)
    entries = {e.name: e for e in flat.manifest}
    assert entries["lm_head.weight"].offset == entries["model.embed_tokens.weight"].offset
    unique = sum(p.numel() for p in model.parameters())  # parameters() counts the tied matrix once
    assert len(flat.buffers["float32"]) == unique
    out = unpack_state(flat)
    assert set(out) == set(views)
    for name, tensor in views.items():
        assert torch.equal(out[name], tensor), name

    clone = tiny_tied_qwen2()
    with torch.no_grad():
        for param in clone.parameters():
            param.add_(1.0)
        clone.load_state_dict(out)
    expected = model.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in clone.state_dict().items())


def test_cloned_tied_snapshot_keeps_both_names():
    model = tiny_tied_qwen2()
    cloned = {name: t.detach().clone() for name, t in state_dict_for_sync(model).items()}
    flat = pack_state(cloned, version=1)
    out = unpack_state(flat)
    assert torch.equal(out["lm_head.weight"], model.lm_head.weight)
    assert torch.equal(out["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_pickle_round_trip_keeps_everything():
    flat = pickle.loads(pickle.dumps(pack_state(mixed_state(), version=4), protocol=5))
    assert flat.version == 4
    assert all(torch.equal(unpack_state(flat)[n], t) for n, t in mixed_state().items())


def test_non_contiguous_input_is_packed_by_value():
    base = torch.arange(12.0).view(3, 4)
    flat = pack_state({"t": base.t()}, version=0)
    assert torch.equal(unpack_state(flat)["t"], base.t())


def test_pack_rejects_duplicate_names_and_complex_dtypes():
    with pytest.raises(ValueError, match="'x' is given twice"):
        pack_state([("x", torch.zeros(2)), ("x", torch.ones(2))], version=0)
    with pytest.raises(ValueError, match="'z' has dtype complex64"):
        pack_state({"z": torch.zeros(2, dtype=torch.complex64)}, version=0)


def _corrupt(flat: FlatWeights, target: str, **changes) -> FlatWeights:
    manifest = tuple(dataclasses.replace(e, **changes) if e.name == target else e for e in flat.manifest)
    return dataclasses.replace(flat, manifest=manifest)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda f: _corrupt(f, "c.bias", shape=(2, 3)),
            r"'c.bias' spans \[12, 18\) beyond the float32 buffer",
        ),
        (lambda f: _corrupt(f, "c.bias", shape=(1, 2)), "'f.empty' at offset 16 leaves a gap at 14"),
        (
            lambda f: dataclasses.replace(f, buffers={**f.buffers, "float32": np.zeros(20, np.uint32)}),
            "float32 buffer has 20 elements but its tensors cover 16",
        ),
        (lambda f: _corrupt(f, "c.bias", offset=11), "'c.bias' at offset 11 overlaps the tensor before it"),
        (lambda f: _corrupt(f, "a.weight", offset=1), "'a.weight' at offset 1 leaves a gap at 0"),
        (lambda f: _corrupt(f, "c.bias", name="a.weight"), r"\['a.weight'\] appear more than once"),
        (
            lambda f: _corrupt(f, "e.step", dtype="float16"),
            "'e.step' has dtype float16 but there is no such buffer",
        ),
        (lambda f: _corrupt(f, "e.step", shape=(-1,)), "'e.step' has bad shape"),
        (
            lambda f: dataclasses.replace(f, buffers={**f.buffers, "float32": f.buffers["float32"][:14]}),
            r"'c.bias' spans \[12, 16\) beyond the float32 buffer of 14",
        ),
        (
            lambda f: dataclasses.replace(f, buffers={**f.buffers, "bfloat16": np.zeros(12, np.float32)}),
            "the bfloat16 buffer must be a 1-D uint16 array",
        ),
        (
            lambda f: dataclasses.replace(f, buffers={**f.buffers, "quux": np.zeros(1, np.uint8)}),
            "unknown dtype",
        ),
        (lambda f: dataclasses.replace(f, version="3"), "version must be an int"),
    ],
)
def test_unpack_rejects_corrupt_manifests_naming_the_problem(mutate, message):
    flat = pack_state(mixed_state(), version=0)
    with pytest.raises(ValueError, match=message):
        unpack_state(mutate(flat))


def test_tensor_entry_arithmetic():
    entry = TensorEntry(name="w", dtype="float32", shape=(2, 3), offset=5)
    assert (entry.numel, entry.end) == (6, 11)
    assert TensorEntry(name="s", dtype="float32", shape=(), offset=0).numel == 1


def _as_device_bucket(flat: FlatWeights) -> DeviceBucket:
    """``flat`` with each buffer as the flat ``uint8`` tensor a broadcast receiver holds."""
    buffers = {dtype: torch.from_numpy(buffer.view(np.uint8)) for dtype, buffer in flat.buffers.items()}
    return DeviceBucket(version=flat.version, manifest=flat.manifest, buffers=buffers)


def test_a_device_bucket_unpacks_to_views_of_its_tensors_exactly_as_flat_weights_do():
    state = mixed_state()
    bucket = _as_device_bucket(pack_state(state, version=4))
    out = unpack_state(bucket)
    assert all(torch.equal(out[name], tensor) for name, tensor in state.items())
    storages = {b.untyped_storage().data_ptr() for b in bucket.buffers.values()}
    assert all(t.untyped_storage().data_ptr() in storages for t in out.values() if t.numel())  # views


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:-4], r"'c.bias' spans \[12, 16\) beyond the float32 buffer of 15"),
        (lambda b: b[:-1], "must be a 1-D uint8 tensor of whole 4-byte elements"),
        (lambda b: b.view(torch.float32), "must be a 1-D uint8 tensor"),
        (lambda b: b.view(2, -1), "must be a 1-D uint8 tensor"),
        (lambda b: torch.cat([b, b])[::2], "the float32 buffer is not contiguous"),
    ],
)
def test_a_device_bucket_with_a_broken_buffer_is_refused_naming_it(mutate, message):
    bucket = _as_device_bucket(pack_state(mixed_state(), version=0))
    broken = dataclasses.replace(
        bucket, buffers={**bucket.buffers, "float32": mutate(bucket.buffers["float32"])}
    )
    with pytest.raises(ValueError, match=message):
        unpack_state(broken)
