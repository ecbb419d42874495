"""``gathered_buckets`` holds a tied tensor's gathered copy until its last name only: under FSDP2 each gather is
a full fp32 matrix on the GPU (Qwen3-1.7B's tied embedding: 1.2 GB), so holding it to the end of the stream
raised every later bucket's peak by that much."""

from __future__ import annotations

import gc
import weakref

import torch

from asyncrl.trainer.distributed.weights import gathered_buckets


class FakeSharded:
    """What ``gathered_buckets`` sees of an FSDP2 parameter: a local shard, and a gather that makes a new
    full tensor each call."""

    def __init__(self, local: torch.Tensor) -> None:
        self.local, self.shape, self.dtype = local, local.shape, local.dtype

    def to_local(self) -> torch.Tensor:
        return self.local

    def full_tensor(self) -> torch.Tensor:
        return self.local.clone()


def test_a_tied_gather_is_gathered_once_and_released_after_its_last_name() -> None:
    tied = FakeSharded(torch.ones(4))
    named = {"embed": tied, "middle": FakeSharded(torch.zeros(4)), "lm_head": tied}
    named |= {f"tail_{i}": FakeSharded(torch.full((4,), float(i))) for i in range(3)}
    buckets = gathered_buckets(named, bucket_bytes=1)  # one tensor per bucket

    [(name, first)] = next(buckets)
    assert name == "embed"
    gathered = weakref.ref(first)
    del first
    assert [name for name, _ in next(buckets)] == ["middle"]
    [(name, again)] = next(buckets)
    assert name == "lm_head" and again is gathered()  # the twin is not gathered twice
    del again
    [(name, _)] = next(buckets)
    assert name == "tail_0"
    gc.collect()
    assert gathered() is None, "the tied gather outlived its last name"
    assert [name for bucket in buckets for name, _ in bucket] == ["tail_1", "tail_2"]
