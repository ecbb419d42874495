"""Sharded checkpoints: each rank writes its shards with torch.distributed.checkpoint (DCP), loadable at any
``num_workers``.

Same guarantees as ``trainer.checkpoint`` (staging directory, hashes in a marker written last, rename, fsync):
rank 0 creates the staging directory and tells the others, every rank writes its shards of the model and the
optimizer into ``sharded/``, and only after all have written does rank 0 add the trainer state, write the
marker and move it into place. DCP stores each tensor with its global shape, so a checkpoint written by N
ranks loads onto M ranks (M = 1 included): the loader asks for the tensors its own sharding needs.

    <root>/step_00000012/
        sharded/             DCP: .metadata + one __<rank>_0.distcp file per writing rank (model + optimizer)
        model/               the full weights for evaluation and serving: config.json + one safetensors file
                             per gathered bucket (rank 0 writes each as it is gathered)
        trainer_state.pt     scheduler, step, version, RNG states (rank 0's)
        extra.json           the caller's dict
        COMPLETE.json        {relative path: sha256}, written last

Every rank must see the same directory (one machine, or a shared filesystem across nodes).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from asyncrl.trainer import checkpoint
from asyncrl.trainer.checkpoint import MODEL_DIR, SHARDED_DIR
from asyncrl.trainer.distributed.weights import full_weight_buckets
from asyncrl.trainer.trainer import Trainer


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / SHARDED_DIR).is_dir()


def save_sharded_checkpoint(
    root: str | os.PathLike[str],
    trainer: Trainer,
    *,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Every rank calls this; each returns the step directory once it is in place."""
    parallel = trainer.parallel
    staged = checkpoint.new_staging(root, trainer.step) if parallel.rank == 0 else None
    staging, final = parallel.gather(staged)[0]  # rank 0's choice, for everyone
    try:
        model_state, optimizer_state = get_state_dict(trainer.model, trainer.optimizer)
        dcp.save(
            {"model": model_state, "optimizer": optimizer_state},
            checkpoint_id=staging / SHARDED_DIR,
            no_dist=parallel.world_size == 1,  # one process: no group to coordinate with
        )
        export_model(trainer, staging / MODEL_DIR)
        parallel.gather(None)  # every rank's shards are written
        if parallel.rank == 0:
            state = {
                "scheduler": trainer.scheduler.state_dict(),
                "step": trainer.step,
                "version": trainer.version,
                "rng": checkpoint.rng_state(),
            }
            checkpoint.write_state(staging, state, extra)
            checkpoint.commit(staging, final, keep_last)
    finally:
        if parallel.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
    parallel.gather(None)  # nobody returns before the checkpoint is in place
    return final


def export_model(trainer: Trainer, directory: Path, bucket_bytes: int = 1 << 30) -> None:
    """Every rank calls this: the full weights as a Hugging Face model directory that ``from_pretrained`` and
    ``asyncrl eval`` load, written by rank 0 one gathered bucket per safetensors file."""
    model = trainer.model
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if trainer.parallel.rank == 0:
        model.config.save_pretrained(directory)
    for index, bucket in enumerate(full_weight_buckets(model, bucket_bytes)):
        if trainer.parallel.rank != 0:
            continue
        # A tied output layer is the embedding: saved once, as from_pretrained expects.
        tensors = {n: t.contiguous() for n, t in bucket if not (tied and n == "lm_head.weight")}
        if tensors:
            save_file(tensors, directory / f"model-{index:05d}.safetensors", metadata={"format": "pt"})


def load_sharded_checkpoint(path: str | os.PathLike[str], trainer: Trainer) -> dict[str, Any]:
    """Every rank calls this: restore weights and optimizer (resharded to this world), scheduler, step and
    version from a verified sharded checkpoint; returns its ``extra``."""
    path = Path(path)
    if trainer.parallel.rank == 0:
        checkpoint.verify_checkpoint(path)
    trainer.parallel.gather(None)  # nobody reads a checkpoint rank 0 has not verified
    if not is_sharded_checkpoint(path):
        raise ValueError(f"{path} is not a sharded checkpoint (no {SHARDED_DIR}/)")
    model_state, optimizer_state = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path / SHARDED_DIR, no_dist=trainer.parallel.world_size == 1)
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )
    trainer_state, extra = checkpoint.read_state(path)
    trainer.scheduler.load_state_dict(trainer_state["scheduler"])
    trainer.step = int(trainer_state["step"])
    trainer.version = int(trainer_state["version"])
    checkpoint.set_rng_state(trainer_state["rng"])
    return extra
