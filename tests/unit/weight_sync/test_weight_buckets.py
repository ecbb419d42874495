"""Weight buckets: bit-exact pack/unpack in every dtype, where buckets are cut, and the serving-dtype cast."""

from __future__ import annotations

import pytest
import torch

from asyncrl.weight_sync.buckets import (
    ALIGN,
    BucketEntry,
    cast_for_serving,
    group_into_buckets,
    layout,
    pack_into,
    unpack,
)


def mixed_tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "f32": torch.randn(7, 3),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "f16_transposed": torch.randn(4, 6).to(torch.float16).t(),  # non-contiguous
        "nan_and_inf": torch.tensor([float("nan"), float("inf"), -0.0]),
        "i64": torch.arange(9, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }


def test_a_packed_bucket_unpacks_bit_for_bit_in_every_dtype():
    named = list(mixed_tensors().items())
    _, size = layout(named)
    buffer = torch.full((size,), 0xAB, dtype=torch.uint8)
    entries = pack_into(buffer, named)
    assert [e.offset % ALIGN for e in entries] == [0] * len(named)
    for (name, original), (unpacked_name, view) in zip(named, unpack(buffer, entries), strict=True):
        assert unpacked_name == name and view.dtype == original.dtype and view.shape == original.shape
        assert bits(view) == bits(original), name


def bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_buckets_are_cut_where_the_next_tensor_would_not_fit_and_a_large_tensor_travels_alone():
    four = [(f"t{i}", torch.zeros(16)) for i in range(4)]  # 64 bytes each: one aligned slot
    assert [len(g) for g in group_into_buckets(four, 128)] == [2, 2]  # an exact fit stays in the bucket
    assert [len(g) for g in group_into_buckets(four, 127)] == [1, 1, 1, 1]
    mixed = [("a", torch.zeros(4)), ("big", torch.zeros(1000)), ("b", torch.zeros(4))]
    groups = list(group_into_buckets(mixed, 256))
    assert [[name for name, _ in g] for g in groups] == [["a"], ["big"], ["b"]]
    assert layout(groups[1])[1] == 4000 + (-4000 % ALIGN)  # its own bucket, its own size
    assert list(group_into_buckets([], 64)) == []
    with pytest.raises(ValueError, match="bucket size must be >= 1 byte"):
        list(group_into_buckets(four, 0))


def test_grouping_is_lazy_so_a_stream_never_holds_more_than_one_bucket_ahead():
    taken = []

    def stream():
        for i in range(6):
            taken.append(i)
            yield f"t{i}", torch.zeros(16)

    groups = group_into_buckets(stream(), 128)
    assert len(next(groups)) == 2 and taken == [0, 1, 2]  # the third tensor closed the first bucket


def test_an_entry_outside_its_bucket_is_refused_by_name():
    buffer = torch.zeros(128, dtype=torch.uint8)
    with pytest.raises(ValueError, match="tensor 'w' spans bytes \\[64, 164\\)"):
        unpack(buffer, [BucketEntry("w", "float32", (25,), 64)])
    with pytest.raises(ValueError, match="'x' .* alignment"):
        unpack(buffer, [BucketEntry("x", "float32", (1,), 4)])
    with pytest.raises(ValueError, match="needs a 1-D uint8 buffer of >= 64 bytes"):
        pack_into(torch.zeros(8, dtype=torch.uint8), [("w", torch.zeros(3))])


def test_the_serving_cast_happens_once_per_matrix_and_passes_what_needs_none():
    embed = torch.randn(6, 4)
    already = torch.randn(3).to(torch.bfloat16)
    steps = torch.arange(3)
    cast = list(
        cast_for_serving(
            [("embed", embed), ("already", already), ("steps", steps), ("lm_head", embed)], "bfloat16"
        )
    )
    by_name = dict(cast)
    assert by_name["embed"] is by_name["lm_head"], "a tied matrix is cast once, both names share it"
    assert by_name["already"] is already and by_name["steps"] is steps  # no copy
    assert torch.equal(by_name["embed"], embed.to(torch.bfloat16))
    with pytest.raises(ValueError, match="floating-point torch dtype, got 'int8'"):
        list(cast_for_serving({"w": embed}, "int8"))


def test_the_serving_cast_holds_a_cast_only_until_its_last_name_is_taken():
    """A tied matrix's later name comes right after its first, so the stream keeps its cast for one name, not
    across every tensor between them (a tied embedding's cast beside every bucket of the model)."""
    import weakref

    embed, norm, head = torch.randn(6, 4), torch.randn(4), torch.randn(3, 4)
    stream = cast_for_serving(
        [("embed", embed), ("norm", norm), ("head", head), ("lm_head", embed)], "bfloat16"
    )
    name, first = next(stream)
    held = weakref.ref(first)
    del first
    assert name == "embed" and held() is not None, "the tied matrix's cast waits for lm_head"
    name, tied = next(stream)
    assert name == "lm_head" and tied is held(), "lm_head comes next, with the same cast"
    del tied
    name, second = next(stream)
    assert name == "norm"
    assert held() is None, "taken under both names, the tied cast is no longer kept by the stream"
    freed = weakref.ref(second)
    del second
    assert next(stream)[0] == "head"
    assert freed() is None, "a cast no later name shares is not kept by the stream"
    assert next(stream, None) is None
