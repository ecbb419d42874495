"""``export_model(checkpoint, out)``: a training checkpoint as a plain Hugging Face model directory, LoRA adapters
merged into the base weights (``asyncrl export``).

Key decisions:
- The base model comes from the run's own resolved config (``config.json`` beside ``checkpoints/``), so a
  checkpoint exports without the user restating which model it was trained from; command-line overrides apply
  on top of it (``run_config_of``), and only a config file named on the command line replaces it.
- A sharded checkpoint's full weights are read from its DCP shards of the masters (``sharded/``), never from its
  ``model/``: that folder is the serving export (bf16 on a GPU run), and an fp32 export of it would be an upcast
  of rounded weights. Its bf16 export is the masters rounded to bf16, so reading the masters gives the same
  bf16 files and every other dtype too, by one path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers import GenerationConfig

from asyncrl.config.base import from_dict
from asyncrl.config.loader import apply_overrides
from asyncrl.config.model import ModelConfig
from asyncrl.config.run import RunConfig
from asyncrl.models.loading import load_configured_model, load_configured_skeleton, model_dir
from asyncrl.models.writing import write_model_directory
from asyncrl.trainer.checkpoint import ADAPTER_DIR, resolve_resume_path, served_model
from asyncrl.trainer.distributed.checkpoint import is_sharded_checkpoint
from asyncrl.trainer.distributed.masters import read_master_buckets, stored_model_tensors

EXPORT_BUCKET_BYTES = 1 << 30
"""Master bytes read (and one safetensors file written) at a time when exporting a sharded checkpoint."""


def run_config_of(checkpoint: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The resolved config of the run that wrote ``checkpoint`` (``<run>/config.json``; ``checkpoint`` may be
    the run directory itself), with dotted ``overrides`` (``model.dtype=float32``) applied on top of it, checked
    as a YAML config's are."""
    checkpoint = checkpoint.resolve()
    for directory in (checkpoint, *checkpoint.parents):
        path = directory / "config.json"
        if path.is_file() and (directory / "checkpoints").is_dir():
            return from_dict(RunConfig, apply_overrides(RunConfig, json.loads(path.read_text()), overrides))
    raise FileNotFoundError(
        f"no run config.json above {checkpoint}: name the run's config or model.path on the command line"
    )


def export_model(
    checkpoint: str | Path, out: str | Path, config: RunConfig | None = None, dtype: str | None = None
) -> Path:
    """Write the weights ``checkpoint`` trained (a step directory, or the newest under a run directory) with
    the tokenizer into ``out``, in ``dtype`` (None: the run's ``model.dtype``, its master dtype): a model
    directory that ``from_pretrained``, vLLM and ``asyncrl eval`` load as a model of its own."""
    path = resolve_resume_path(checkpoint)
    config = config or run_config_of(path)
    # on the host, whatever the run trained with (a CUDA-only attention is refused with model.device: cpu)
    model_config = replace(
        config.model, device="cpu", attn_implementation="sdpa", dtype=dtype or config.model.dtype
    )
    out = Path(out)
    if is_sharded_checkpoint(path) and not (path / ADAPTER_DIR).is_dir():
        export_masters(path, out, model_config)
        return out
    model, tokenizer = load_configured_model(model_config)
    model = served_model(model, path)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def export_masters(
    path: Path, out: Path, model_config: ModelConfig, bucket_bytes: int = EXPORT_BUCKET_BYTES
) -> None:
    """The master weights of sharded checkpoint ``path``, cast to ``model_config.dtype``, as a model directory
    with the config, generation config and tokenizer of ``model_config``'s model.

    Memory: the model is a skeleton on the meta device (no bytes; it only names the tensors and carries the
    config), and the masters stream through a bucket at a time, so the peak is about one bucket of masters, its
    cast copy (none when the dtype is the masters'), and one rank's chunk of one tensor as DCP reads it, however
    large the model. Measured (peak RSS above the process's before the call, CPU, 267 M parameters: a 1.07 GB
    fp32 checkpoint written by one process): 1.15 GB with 1 GiB buckets (the whole model is one bucket there),
    0.41 GB with 64 MiB buckets (its largest bucket is the 131 MB embedding alone, and DCP's read of it). At 8B,
    by the same arithmetic and not measured: about 2.5 GB of embedding (a bucket of its own) plus a rank's
    chunk of it, not the 32.8 GB model.
    """
    skeleton, tokenizer = load_configured_skeleton(model_config)
    wanted = list(skeleton.state_dict())
    stored = stored_model_tensors(path)
    missing, unexpected = sorted(set(wanted) - set(stored)), sorted(set(stored) - set(wanted))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match model.path {model_config.path!r}: "
            f"missing {missing}, unexpected {unexpected}"
        )
    tied = bool(getattr(skeleton.config, "tie_word_embeddings", False))
    # A tied output layer is the embedding, stored twice: read once.
    names = [name for name in wanted if not (tied and name == "lm_head.weight")]
    write_model_directory(
        read_master_buckets(path, names, bucket_bytes),
        out,
        skeleton.config,
        getattr(torch, model_config.dtype),
        tokenizer=tokenizer,
        generation_config=_generation_config(model_config),
    )


def _generation_config(model_config: ModelConfig) -> GenerationConfig | None:
    """The model directory's generation config (its eos and sampling defaults), as ``save_pretrained`` of the
    loaded model would write it; None when the directory has none."""
    directory = model_dir(model_config)
    if not (directory / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(directory, local_files_only=True)
