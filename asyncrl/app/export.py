"""``export_model(checkpoint, out)``: a training checkpoint as a plain Hugging Face model directory, LoRA adapters
merged into the base weights (``asyncrl export``).

Key decision: the base model comes from the run's own resolved config (``config.json`` beside ``checkpoints/``),
so a checkpoint exports without the user restating which model it was trained from; a config given on the
command line wins.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from asyncrl.config.base import from_dict
from asyncrl.config.run import RunConfig
from asyncrl.models.loading import load_configured_model
from asyncrl.trainer.checkpoint import resolve_resume_path, served_model


def run_config_of(checkpoint: Path) -> RunConfig:
    """The resolved config of the run that wrote ``checkpoint`` (``<run>/config.json``)."""
    for directory in checkpoint.resolve().parents:
        path = directory / "config.json"
        if path.is_file() and (directory / "checkpoints").is_dir():
            return from_dict(RunConfig, json.loads(path.read_text()))
    raise FileNotFoundError(
        f"no run config.json above {checkpoint}: name the run's config or model.path on the command line"
    )


def export_model(checkpoint: str | Path, out: str | Path, config: RunConfig | None = None) -> Path:
    """Write the weights ``checkpoint`` trained (a step directory, or the newest under a run directory) with
    the tokenizer into ``out``: ``save_pretrained`` output that ``from_pretrained``, vLLM and ``asyncrl eval``
    load as a model of its own."""
    path = resolve_resume_path(checkpoint)
    config = config or run_config_of(path)
    # on the host, whatever the run trained with (a CUDA-only attention is refused with model.device: cpu)
    model, tokenizer = load_configured_model(replace(config.model, device="cpu", attn_implementation="sdpa"))
    model = served_model(model, path)
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
