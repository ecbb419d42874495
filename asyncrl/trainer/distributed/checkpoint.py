"""Sharded checkpoints: each rank writes its shards with torch.distributed.checkpoint (DCP), loadable at any
``num_workers``.

Same guarantees as ``trainer.checkpoint`` (staging directory, hashes in a marker written last, rename, fsync):
rank 0 creates the staging directory and tells the others, every rank writes its shards of the model and the
optimizer into ``sharded/``, and only after all have written do the ranks fsync and hash the files, dealt out
by size (a large checkpoint's hashing takes about 1/N of one rank's time), and rank 0 adds the trainer state,
writes the marker and moves it into place. A load verifies the hashes the same way, dealt out. The marker is
the one-process format's ({relative path: sha256}), whoever hashed which file. DCP stores each tensor with its
global shape, so a checkpoint written by N ranks loads onto M ranks (M = 1 included): the loader asks for the
tensors its own sharding needs.

    <root>/step_00000012/
        sharded/             DCP: .metadata + one __<rank>_0.distcp file per writing rank (model + optimizer, and
                             a critic's model + optimizer)
        model/               the full weights for evaluation and serving, a Hugging Face directory that
                             ``from_pretrained`` loads: config.json, one safetensors file per gathered bucket
                             (rank 0 writes each as it is gathered), model.safetensors.index.json and the
                             tokenizer, in the serving dtype unless the caller names another
        adapter/             instead of model/ with LoRA: the gathered adapters in peft's format (sharded/
                             then holds only the adapters and their optimizer state)
        trainer_state.pt     scheduler, step, version, skipped-update count, RNG states (rank 0's)
        extra.json           the caller's dict (rank 0 writes it, and only rank 0 reads it back)
        COMPLETE.json        {relative path: sha256}, written last

Every rank must see the same directory (one machine, or a shared filesystem across nodes). A save of the step
the ranks last saved or loaded (no train step since) has rank 0 rewrite only ``extra.json``, hard-linking the
rest (``checkpoint.relink_saved``); the other ranks only meet it at the gathers.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from transformers import PreTrainedTokenizerBase

from asyncrl.models.writing import write_model_directory
from asyncrl.trainer import checkpoint
from asyncrl.trainer.checkpoint import ADAPTER_DIR, MODEL_DIR, SHARDED_DIR, TornCheckpointError
from asyncrl.trainer.distributed.parallel import Parallelism
from asyncrl.trainer.distributed.weights import full_weight_buckets
from asyncrl.trainer.lora import save_adapter
from asyncrl.trainer.trainer import Trainer


def _state(trainer: Trainer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts of this rank's shards, as DCP saves and loads them. With LoRA only the
    trainable adapters and their optimizer state: the frozen base is the model directory's own (a tied output
    layer, which the frozen-parameter filter misses under its second name, is dropped too)."""
    model_state, optimizer_state = get_state_dict(trainer.model, trainer.optimizer, options=_options(trainer))
    if trainer.peft_model is not None:
        trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
        model_state = {name: t for name, t in model_state.items() if name in trainable}
    return model_state, optimizer_state


def _options(trainer: Trainer) -> StateDictOptions:
    """LoRA: frozen parameters are neither saved nor expected back (``_state``)."""
    lora = trainer.peft_model is not None
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / SHARDED_DIR).is_dir()


def save_sharded_checkpoint(
    root: str | os.PathLike[str],
    trainer: Trainer,
    *,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_dtype: torch.dtype | None = None,
) -> Path:
    """Every rank calls this; each returns the step directory once it is in place. ``extra`` is rank 0's (the
    others' is not read: the caller need not send it to them). ``tokenizer`` and ``model_dtype`` (None: the
    trainer's own dtype) are those of the ``model/`` export (``export_model``)."""
    parallel = trainer.parallel
    staged = checkpoint.new_staging(root, trainer.step) if parallel.rank == 0 else None
    staging, final = parallel.gather(staged)[0]  # rank 0's choice, for everyone
    try:
        # rank 0's answer, for everyone: whether the shards are written again
        relinked = checkpoint.relink_saved(trainer, final, staging) if parallel.rank == 0 else None
        relinked = parallel.gather(relinked)[0]
        if relinked is None:
            hashed = _write_state_files(trainer, staging, tokenizer, model_dtype)
        else:
            hashed = relinked
        if parallel.rank == 0:
            if relinked is None:
                checkpoint.write_state(staging, _trainer_state(trainer), extra)
            else:
                checkpoint.write_extra(staging, extra)
            checkpoint.commit(staging, final, keep_last, hashed)  # hashes the state files it just wrote
    finally:
        if parallel.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
    parallel.gather(None)  # nobody returns before the checkpoint is in place
    trainer.saved_in = final
    return final


def _write_state_files(
    trainer: Trainer,
    staging: Path,
    tokenizer: PreTrainedTokenizerBase | None,
    model_dtype: torch.dtype | None,
) -> dict[str, str]:
    """Every rank: its shards, the export (or adapters), then its share of the hashing; every file's hash."""
    parallel = trainer.parallel
    dcp.save(
        _dcp_state(trainer),
        checkpoint_id=staging / SHARDED_DIR,
        no_dist=parallel.world_size == 1,  # one process: no group to coordinate with
    )
    if trainer.peft_model is not None:
        save_adapter(trainer.peft_model, staging / ADAPTER_DIR, is_main_process=parallel.rank == 0)
    else:
        export_model(trainer, staging / MODEL_DIR, tokenizer=tokenizer, dtype=model_dtype)
    parallel.gather(None)  # every rank's shards are written
    return _hash_dealt_out(parallel, staging)


def _trainer_state(trainer: Trainer) -> dict[str, Any]:
    """What ``trainer_state.pt`` holds beside the shards (rank 0's)."""
    state = {
        "scheduler": trainer.scheduler.state_dict(),
        "step": trainer.step,
        "version": trainer.version,
        "skipped_in_a_row": trainer.skipped_in_a_row,
        "rng": checkpoint.rng_state(trainer.device),
    }
    if trainer.critic is not None:
        state["critic_scheduler"] = trainer.critic.scheduler.state_dict()
    return state


def deal_by_size(directory: Path, names: list[str], ranks: int) -> list[list[str]]:
    """``names`` (files under ``directory``) dealt into ``ranks`` shares of about equal bytes, largest first,
    each to the lightest share so far: what each rank hashes."""
    shares: list[list[str]] = [[] for _ in range(ranks)]
    loads = [0] * ranks
    for size, name in sorted(((directory / n).stat().st_size, n) for n in names)[::-1]:
        lightest = loads.index(min(loads))
        shares[lightest].append(name)
        loads[lightest] += size
    return shares


def _hash_dealt_out(parallel: Parallelism, staging: Path) -> dict[str, str]:
    """Every rank calls this once all have written: the files rank 0 lists, dealt out by size, each rank
    fsyncing and hashing its share; every file's hash, on every rank. Hashing is most of a large save's time
    after the writes (Qwen3-8B's ~115 GB at ~1.3 GB/s is ~88 s on one rank), and the ranks do it together."""
    shares = None
    if parallel.rank == 0:  # one listing of the directory, for every rank
        shares = deal_by_size(staging, checkpoint.checkpoint_files(staging), parallel.world_size)
    share = parallel.gather(shares)[0][parallel.rank]
    return {
        name: digest
        for part in parallel.gather(checkpoint.hash_files(staging, share))
        for name, digest in part.items()
    }


def _verify_dealt_out(parallel: Parallelism, path: Path) -> None:
    """Every rank calls this: ``checkpoint.verify_checkpoint`` with the hashing dealt out by size over the
    ranks; every rank raises the same ``TornCheckpointError``, naming the first problem found (rank 0's check
    of the marker and the files present, else the lowest rank's wrong hash)."""
    plan: tuple[dict[str, str], list[list[str]]] | str | None = None
    if parallel.rank == 0:
        try:
            expected = checkpoint.marker_hashes(path)
            plan = (expected, deal_by_size(path, sorted(expected), parallel.world_size))
        except TornCheckpointError as error:
            plan = str(error)
    plan = parallel.gather(plan)[0]
    if isinstance(plan, str):
        raise TornCheckpointError(plan)
    assert plan is not None  # rank 0 always sends one
    expected, shares = plan
    try:
        checkpoint.check_hashes(path, shares[parallel.rank], expected)
        problem = None
    except TornCheckpointError as error:
        problem = str(error)
    problems = [p for p in parallel.gather(problem) if p is not None]
    if problems:
        raise TornCheckpointError(problems[0])


def _dcp_state(trainer: Trainer) -> dict[str, Any]:
    """What DCP saves and loads: the policy and its optimizer, and the critic's when there is one."""
    model_state, optimizer_state = _state(trainer)
    state = {"model": model_state, "optimizer": optimizer_state}
    if trainer.critic is not None:
        state["critic"], state["critic_optimizer"] = get_state_dict(
            trainer.critic.module, trainer.critic.optimizer
        )
    return state


def export_model(
    trainer: Trainer,
    directory: Path,
    bucket_bytes: int = 1 << 30,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Every rank calls this: the full weights as a Hugging Face model directory that
    ``AutoModelForCausalLM.from_pretrained`` and ``asyncrl eval`` load, written by rank 0 one gathered bucket
    per safetensors file (``models.writing``), cast to ``dtype`` (None: as trained), with the tokenizer when
    one is given."""
    model = trainer.model
    buckets = full_weight_buckets(model, bucket_bytes)
    if trainer.parallel.rank != 0:
        for _ in buckets:  # the gathers are collectives: every rank takes part in each
            pass
        return
    dtype = dtype or next(iter(model.parameters())).dtype
    write_model_directory(buckets, directory, model.config, dtype, tokenizer=tokenizer)


def load_sharded_checkpoint(path: str | os.PathLike[str], trainer: Trainer) -> dict[str, Any]:
    """Every rank calls this: restore weights and optimizer (resharded to this world), scheduler, step and
    version from a verified sharded checkpoint; returns its ``extra`` on rank 0 and ``{}`` on the others (it
    holds every buffered group: hundreds of MB that only the caller, through rank 0, reads)."""
    path = Path(path)
    _verify_dealt_out(trainer.parallel, path)  # nobody reads a checkpoint before every file is verified
    if not is_sharded_checkpoint(path):
        raise ValueError(f"{path} is not a sharded checkpoint (no {SHARDED_DIR}/)")
    lora = trainer.peft_model is not None
    if lora != (path / ADAPTER_DIR).is_dir():
        held = "LoRA adapters" if not lora else "full weights"
        raise ValueError(f"{path} holds {held}: resume it with the trainer.lora settings that wrote it")
    trainer_state = checkpoint.read_state(path)
    if ("critic_scheduler" in trainer_state) != (trainer.critic is not None):
        raise ValueError(
            f"{path}: checkpoint and run disagree on the critic (one has a critic section, one not)"
        )
    trainer.saved_in = None  # until the load is done, no checkpoint holds its state
    state = _dcp_state(trainer)
    dcp.load(state, checkpoint_id=path / SHARDED_DIR, no_dist=trainer.parallel.world_size == 1)
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=_options(trainer),
    )
    trainer.scheduler.load_state_dict(trainer_state["scheduler"])
    if trainer.critic is not None:
        critic = trainer.critic
        set_state_dict(
            critic.module,
            critic.optimizer,
            model_state_dict=state["critic"],
            optim_state_dict=state["critic_optimizer"],
        )
        critic.scheduler.load_state_dict(trainer_state["critic_scheduler"])
    trainer.step = int(trainer_state["step"])
    trainer.version = int(trainer_state["version"])
    trainer.skipped_in_a_row = int(trainer_state.get("skipped_in_a_row", 0))  # absent from older checkpoints
    checkpoint.set_rng_state(trainer_state["rng"], trainer.device)
    trainer.saved_in = path
    return checkpoint.read_extra(path) if trainer.parallel.rank == 0 else {}
