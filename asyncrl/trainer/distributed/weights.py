"""Full weights out of a (possibly sharded) trainer, one bucket at a time.

Why buckets: a sharded model never exists whole on one rank, and gathering all of it before sending would need
the memory sharding was meant to save. Every rank walks the same names in the same order and all-gathers one
parameter at a time (``DTensor.full_tensor`` is a collective); tensors are grouped into buckets of about
``bucket_bytes``, each handed to the caller and dropped before the next is gathered. In one process the
"gathered" tensors are views of the model and nothing is collective.

Tied embeddings: the output layer is listed under its own name (``models.loading.state_dict_for_sync``) and
gathered once, both names sharing the full tensor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn

from asyncrl.models.loading import state_dict_for_sync
from asyncrl.weight_sync.buckets import group_into_buckets

DEFAULT_BUCKET_BYTES = 256 * 2**20
"""Bucket size when none is configured: large enough that per-bucket overheads vanish, small next to a model."""


def full_weight_buckets(
    model: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``[(name, full tensor), ...]`` buckets of ``model``'s weights, each at most ``bucket_bytes`` unless one
    tensor alone is larger. Every rank of a sharded model must consume the iterator to the end, in step."""
    return gathered_buckets(state_dict_for_sync(model), bucket_bytes)


def gathered_buckets(
    named: Mapping[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``full_weight_buckets`` of any named tensors of a (possibly sharded) model, e.g. only its LoRA adapters
    (``Trainer.sync_tensors``)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    keys = [_storage_key(tensor) for tensor in named.values()]
    last_use = {key: index for index, key in enumerate(keys)}  # a tied twin is held until its last name only

    def gathered() -> Iterator[tuple[str, torch.Tensor]]:
        twins: dict[tuple, torch.Tensor] = {}
        for index, ((name, tensor), key) in enumerate(zip(named.items(), keys, strict=True)):
            full = twins.pop(key, None)
            if full is None:
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if last_use[key] > index:
                twins[key] = full
            yield name, full

    return group_into_buckets(
        gathered(), bucket_bytes, size_of=lambda full: full.numel() * full.element_size()
    )


def _storage_key(tensor: torch.Tensor) -> tuple:
    """Identity of a tensor's memory (of its local shard under FSDP2): equal for tied names."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return (local.data_ptr(), tuple(tensor.shape), tensor.dtype)
