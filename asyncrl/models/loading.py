"""Saving and loading models through the real Hugging Face paths: local directories, shipped warm starts and
hub ids (at a pinned revision, through the hub cache), and tied weights.

Key decision: a model name is first resolved to a directory (``resolve_model_path``; hub ids through
``asyncrl.hub``), and everything then goes through ``save_pretrained`` / ``from_pretrained`` / ``AutoTokenizer``
on that directory with ``local_files_only=True``, so a tiny model takes exactly the path a downloaded
checkpoint takes, and only the resolution step may touch the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from asyncrl.config.critic import CRITIC_KEYS, CriticConfig
from asyncrl.config.model import MODEL_KEYS, ModelConfig, ModelKeys
from asyncrl.hub import MODEL_FILE_PATTERNS, MODEL_IGNORE_PATTERNS, is_hub_id, snapshot
from asyncrl.models.attention import check_attention

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
"""The shipped warm-start checkpoints, each a model directory named after its task (``tiny-copy``, ...)."""
DEFAULT_MODEL_DIR = ASSETS_DIR / "tiny-copy"
"""The embedded default model that ``model.path: ""`` stands for (written by ``asyncrl sft``)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(
    path: str, revision: str = "", *, local_files_only: bool = False, keys: ModelKeys = MODEL_KEYS
) -> Path:
    """The model directory ``path`` names: a directory, a shipped checkpoint's name (``tiny-count``), empty for
    the embedded default, or a hub id (``Qwen/Qwen3-1.7B``) at ``revision``, resolved into the hub cache
    (downloaded unless ``local_files_only`` or ``HF_HUB_OFFLINE=1``). Errors name what was looked for and the
    config ``keys`` (path, revision) that set it, so a critic's failure is not reported as the policy's."""
    path_key, revision_key = keys
    resolved = Path(path) if path else DEFAULT_MODEL_DIR
    if path and not (resolved / "config.json").is_file() and (ASSETS_DIR / path / "config.json").is_file():
        resolved = ASSETS_DIR / path
    local = (resolved / "config.json").is_file()
    if revision and local:
        raise ValueError(f"{revision_key} ({revision!r}) applies to hub ids; {path!r} is a local directory")
    if local:
        return resolved
    if path and not resolved.exists() and is_hub_id(path):
        return snapshot(
            path,
            revision=revision,
            local_files_only=local_files_only,
            allow_patterns=MODEL_FILE_PATTERNS,
            ignore_patterns=MODEL_IGNORE_PATTERNS,
            what=path_key,
        )
    what = "the embedded default model" if not path else path_key
    raise FileNotFoundError(f"{what}: no model directory (config.json) at {resolved}, and not a hub id")


def model_dir(config: ModelConfig) -> Path:
    """The directory of the model ``config`` names (``model.path`` at ``model.revision``)."""
    return resolve_model_path(config.path, config.revision, local_files_only=config.local_files_only)


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


def load_tokenizer(
    path: str, revision: str = "", *, local_files_only: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer of the model ``path`` names ("" = the embedded default; see ``resolve_model_path``)."""
    directory = resolve_model_path(path, revision, local_files_only=local_files_only)
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def load_model_and_tokenizer(
    path: str,
    dtype: str = "float32",
    device: str | None = "auto",
    *,
    revision: str = "",
    local_files_only: bool = False,
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer ("" = the embedded default; a directory, warm start or hub id, see
    ``resolve_model_path``), in eval mode, with ``attn_implementation`` for its Hugging Face forward (checked
    first against this machine and ``device``, ``models.attention``); ``device`` None: left in host memory,
    where it is read into (and checked as for ``auto``, where it would run)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, _DTYPES))}, got {dtype!r}")
    check_attention(attn_implementation, resolve_device(device or "auto"))
    directory = resolve_model_path(path, revision, local_files_only=local_files_only)
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=_DTYPES[dtype], local_files_only=True, attn_implementation=attn_implementation
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if device is not None:
        model = model.to(resolve_device(device))
    return model.eval(), tokenizer


def load_configured_model(
    config: ModelConfig, *, on_host: bool = False, for_trainer: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer a run's ``model`` section names, in its dtype on its device; ``on_host``: left
    in host memory instead, for an engine that starts asleep at level 2 and moves its weights to that device
    only when woken (``LLMEngine(device=)``). ``for_trainer``: the trainer runs this model's Hugging Face
    forward, so it gets ``model.attn_implementation`` (checked against this machine first); otherwise the
    default sdpa, unchecked: an engine attends with its own kernels (an engine actor may well be on a CPU
    where a trainer's flash or flex attention could not run), and exporting runs no forward."""
    return load_model_and_tokenizer(
        config.path,
        config.dtype,
        None if on_host else config.device,
        revision=config.revision,
        local_files_only=config.local_files_only,
        attn_implementation=config.attn_implementation if for_trainer else "sdpa",
    )


def load_configured_skeleton(config: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model a run's ``model`` section names with its parameters on the meta device (no bytes), in its
    dtype, and its tokenizer.

    For a sharded trainer: each rank shards the skeleton and then reads only its own shards of the weights
    (``trainer.distributed.sharded_load``), instead of every rank holding the whole model first. Buffers
    (e.g. rotary ``inv_freq``, computed from the config rather than stored) are built for real, as
    ``from_pretrained`` would; the files' tensors are not read here at all.
    """
    attention = _checked_attention(config)  # before the model is resolved (a hub id may download)
    directory = model_dir(config)
    model = _skeleton(AutoModelForCausalLM, directory, config.dtype, attention)
    return model, AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _checked_attention(config: ModelConfig) -> str:
    """``config.attn_implementation``, once this machine is known to run it where ``config.device`` resolves."""
    check_attention(config.attn_implementation, resolve_device(config.device))
    return config.attn_implementation


def _skeleton(auto_class: Any, directory: Path, dtype: str, attn_implementation: str) -> PreTrainedModel:
    """``auto_class``'s model of ``directory``'s config with its parameters on the meta device (buffers real),
    in ``dtype`` and ``attn_implementation``, in eval mode."""
    from accelerate import init_empty_weights

    if dtype not in _DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(map(repr, _DTYPES))}, got {dtype!r}")
    model_config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with init_empty_weights(include_buffers=False):
        model = auto_class.from_config(
            model_config, dtype=_DTYPES[dtype], attn_implementation=attn_implementation
        )
    model.tie_weights()  # the context re-registers every parameter, untying a tied output layer
    return model.eval()


def critic_model_dir(critic: CriticConfig, *, local_files_only: bool = False) -> Path:
    """The directory of the body ``critic.model_path`` names, at ``critic.revision`` (the critic's own
    repository's, never the policy's ``model.revision``); errors name the critic's keys."""
    if critic.model_path is None:
        raise ValueError("critic.model_path is null: the critic is a copy of the policy, it has no files")
    return resolve_model_path(
        critic.model_path, critic.revision, local_files_only=local_files_only, keys=CRITIC_KEYS
    )


def load_decoder_body(directory: Path, config: ModelConfig) -> PreTrainedModel:
    """The decoder body (``AutoModel``: no vocabulary projection or task head) of the checkpoint in
    ``directory`` — a causal LM or a reward model — in ``config``'s dtype, on its device; e.g. a separate
    critic's starting point (``critic_model_dir``). It takes a resolved directory, not a path, because the body's
    revision is its own repository's, not ``config.revision``."""
    body = AutoModel.from_pretrained(
        directory,
        dtype=_DTYPES[config.dtype],
        local_files_only=True,
        attn_implementation=_checked_attention(config),
    )
    return body.to(resolve_device(config.device)).eval()


def load_decoder_skeleton(directory: Path, config: ModelConfig) -> PreTrainedModel:
    """``load_decoder_body``'s body with its parameters on the meta device: for a sharded trainer, whose ranks
    each read only their shards of it from ``directory`` (as the policy's, ``load_configured_skeleton``)."""
    return _skeleton(AutoModel, directory, config.dtype, _checked_attention(config))


def load_configured_tokenizer(config: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of the model a run's ``model`` section names."""
    return load_tokenizer(config.path, config.revision, local_files_only=config.local_files_only)


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
