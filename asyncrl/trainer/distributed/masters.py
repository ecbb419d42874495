"""The master weights of a sharded checkpoint as full tensors, read in one process a bucket at a time.

Why: a sharded checkpoint's ``model/`` is the serving export (bf16 on a GPU run), so anything that wants the
weights as trained (``asyncrl export`` in fp32) must read ``sharded/``, the DCP shards of the masters. DCP
stores each tensor with its global shape and loads into whatever tensors it is handed, so a process with no
process group (``no_dist=True``) asks for full tensors and gets every rank's shards of them stitched together.

Key decision: one ``dcp.load`` per bucket, into tensors allocated for that bucket only. DCP's file reader reads
just the requested items (one rank's chunk of one tensor at a time, copied into its place), so the memory
held is a bucket of full tensors plus one chunk, whatever the model's size, and the caller writes each bucket
out before the next is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from asyncrl.trainer.checkpoint import SHARDED_DIR
from asyncrl.weight_sync.buckets import group_into_buckets

MODEL_KEY = "model"
"""The policy's entry in the DCP state (``distributed.checkpoint._dcp_state``): its tensors are stored as
``model.<parameter name>``."""


def stored_model_tensors(path: Path) -> dict[str, TensorStorageMetadata]:
    """{parameter name: its stored shape and dtype} of the policy in checkpoint ``path``'s ``sharded/``."""
    metadata = FileSystemReader(path / SHARDED_DIR).read_metadata().state_dict_metadata
    prefix = f"{MODEL_KEY}."
    return {
        key.removeprefix(prefix): stored
        for key, stored in metadata.items()
        if key.startswith(prefix) and isinstance(stored, TensorStorageMetadata)
    }


def read_master_buckets(
    path: Path, names: Sequence[str], bucket_bytes: int = 1 << 30
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``[(name, full tensor), ...]`` of the policy's ``names`` in checkpoint ``path``, in the stored (master)
    dtype, in buckets of about ``bucket_bytes`` (a larger tensor alone). Each bucket is fresh memory the
    caller may keep or drop; ``KeyError`` names any of ``names`` the checkpoint does not hold."""
    stored = stored_model_tensors(path)
    missing = [name for name in names if name not in stored]
    if missing:
        raise KeyError(f"{path / SHARDED_DIR} holds no {MODEL_KEY} tensors named {missing}")
    wanted = [(name, stored[name]) for name in names]
    for bucket in group_into_buckets(wanted, bucket_bytes, size_of=_nbytes):
        tensors = {name: torch.empty(held.size, dtype=held.properties.dtype) for name, held in bucket}
        dcp.load({MODEL_KEY: tensors}, checkpoint_id=path / SHARDED_DIR, no_dist=True)
        yield list(tensors.items())


def _nbytes(stored: TensorStorageMetadata) -> int:
    return stored.size.numel() * stored.properties.dtype.itemsize
