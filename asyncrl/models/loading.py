"""Saving and loading model directories through the real Hugging Face paths, offline, and tied weights.

Key decision: everything goes through ``save_pretrained`` / ``from_pretrained`` / ``AutoTokenizer`` with
``local_files_only=True``, so a tiny model takes exactly the path a downloaded checkpoint takes, and nothing
ever reaches for the hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
"""The shipped warm-start checkpoints, each a model directory named after its task (``tiny-copy``, ...)."""
DEFAULT_MODEL_DIR = ASSETS_DIR / "tiny-copy"
"""The embedded default model that ``model.path: ""`` stands for (written by ``asyncrl sft``)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> Path:
    """The model directory ``path`` names: a directory, a shipped checkpoint's name (``tiny-count``), or empty
    for the embedded default. Errors name the missing dir."""
    resolved = Path(path) if path else DEFAULT_MODEL_DIR
    if path and not (resolved / "config.json").is_file() and (ASSETS_DIR / path / "config.json").is_file():
        resolved = ASSETS_DIR / path
    if not (resolved / "config.json").is_file():
        what = "the embedded default model" if not path else "model.path"
        raise FileNotFoundError(f"{what}: no model directory (config.json) at {resolved}")
    return resolved


def resolve_device(device: str) -> torch.device:
    """``auto`` is cuda when a GPU is visible, else cpu; ``cpu`` and ``cuda`` are taken as they are."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Write model (safetensors), generation config and tokenizer into ``out_dir`` with ``save_pretrained``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of the model directory ``path`` ("" = the embedded default), offline."""
    return AutoTokenizer.from_pretrained(resolve_model_path(path), local_files_only=True)


def load_model_and_tokenizer(
    path: str, dtype: str = "float32", device: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local directory ("" = the embedded default), in eval mode."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, _DTYPES))}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(path), dtype=_DTYPES[dtype], local_files_only=True
    )
    return model.to(resolve_device(device)).eval(), load_tokenizer(path)


def state_dict_for_sync(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Every tensor a receiver needs to become an exact copy of ``model``, ``lm_head.weight`` always included.

    Why: with tied embeddings the output layer is the input embedding matrix under a second name, and tools
    that drop shared tensors (``named_parameters()``, safetensors saving) keep only one name. A receiver
    that copies by name into a model whose output layer is its own tensor (untied, or re-tied differently,
    as in vLLM) would then keep a stale output layer and sample from old weights without any error. The
    tensors are detached views, not copies: serialise or clone them before the model trains again.
    """
    tensors = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    output = model.get_output_embeddings()
    if output is not None and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = output.weight.detach()
    return tensors


def describe(model: PreTrainedModel) -> dict[str, Any]:
    """A few facts about a model for logs: architecture, parameter count, tied embeddings, dtype."""
    return {
        "model_type": model.config.model_type,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "tie_word_embeddings": bool(model.config.tie_word_embeddings),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }
