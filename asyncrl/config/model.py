"""Configuration of the policy model: where its weights live, their dtype, the device to run on, and the attention
implementation the trainer's Hugging Face forward uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTN_IMPLEMENTATIONS = (
    "sdpa",
    "eager",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
)
"""What transformers (5.x) accepts as ``attn_implementation`` for a decoder, less its deprecated ``paged|`` forms
and hub kernel ids (``tests/unit/config/test_model_attention.py`` compares this list with the installed
transformers' ``AttentionInterface``)."""
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
CUDA_ONLY_ATTENTION = (*FLASH_ATTENTION, "flex_attention")
"""Implementations a trainer cannot run on CPU: flash-attn's kernels are CUDA-only, and torch's FlexAttention has
no backward on CPU (torch 2.13: ``NotImplementedError``; its forward runs there, compiled)."""

ModelKeys = tuple[str, str]
"""The config keys that name a model's path and its revision: what a failure to resolve them names."""
MODEL_KEYS: ModelKeys = ("model.path", "model.revision")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which causal LM to load and how; the same model serves the engine and the trainer."""

    path: str = ""
    """Hugging Face model directory (config, safetensors weights, tokenizer), the name of a warm start shipped
    in ``asyncrl/assets`` (``tiny-copy``, ``tiny-count``), or a hub id (``Qwen/Qwen3-1.7B``) resolved through
    ``huggingface_hub`` into the standard cache (``HF_HOME``; offline with ``HF_HUB_OFFLINE=1``). Empty: the
    embedded default ``tiny-copy`` (reproduced by ``asyncrl sft``)."""
    revision: str = ""
    """Hub ids: the branch, tag or commit to load (pin a commit for a reproducible run); empty: ``main``.
    An error with a local directory."""
    local_files_only: bool = False
    """Hub ids: never download, load only what the hub cache holds (as ``HF_HUB_OFFLINE=1`` does); a model
    missing from the cache is an error naming the id and the cache."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype after loading. float32 on CPU; bfloat16 is the usual choice on GPUs."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs: auto takes cuda when a GPU is visible, else cpu."""
    attn_implementation: Literal[
        "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4"
    ] = "sdpa"
    """The attention of the trainer's and critic's Hugging Face models (the built-in engine has its own; vLLM
    picks its own). ``sdpa``: torch's scaled_dot_product_attention; packed rows get a dense block-diagonal mask
    (row² per row). ``eager``: plain matmul and softmax, also a dense mask and every head's row² weights saved
    per layer. ``flex_attention`` (CUDA): a compiled kernel with a block-sparse document mask built from the
    packed position ids. ``flash_attention_2/3/4`` (CUDA, the flash-attn package; half precision: bfloat16/
    float16 weights, ``trainer.compute_dtype`` or ``trainer.mixed_precision``): variable-length kernels, all
    packed samples in one row. See docs/scaling.md, "Attention implementations and packed rows"."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {', '.join(map(repr, DTYPES))}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(
                f"model.device must be one of {', '.join(map(repr, DEVICES))}, got {self.device!r}"
            )
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                "model.attn_implementation must be one of "
                f"{', '.join(map(repr, ATTN_IMPLEMENTATIONS))}, got {self.attn_implementation!r}"
            )
        if self.device == "cpu" and self.attn_implementation in CUDA_ONLY_ATTENTION:
            raise ValueError(
                f"model.attn_implementation={self.attn_implementation!r} does not train on CPU "
                f"(model.device='cpu'): {cpu_refusal(self.attn_implementation)}; use 'sdpa' or 'eager' on CPU"
            )


def cpu_refusal(attn_implementation: str) -> str:
    """Why ``attn_implementation`` (one of ``CUDA_ONLY_ATTENTION``) cannot train on CPU."""
    if attn_implementation == "flex_attention":
        return "torch's FlexAttention has no backward on CPU"
    return "flash-attn's kernels run only on CUDA"
