"""Which Hugging Face decoder families the built-in engine runs, and the few places where they differ.

Key decision: the model runner reads every weight from the HF module objects, so a family fits when its
layer is the pre-norm Llama shape (``input_layernorm → attention → + → post_attention_layernorm → mlp → +``)
and differs only in how q/k/v come out of the attention module. An ``Architecture`` names exactly those
differences: fused or separate projections, per-head q/k RMS-norms (Qwen3), and the family's own rotary
function (Phi-3 rotates only part of each head). Norm flavours (Gemma's ``1 + weight``), embedding scaling
(Gemma) and MLP activations live inside the HF modules and need nothing here. Families whose layers differ
in shape (post-norms, soft-capping, residual multipliers, mixtures of experts) get a named error pointing to
the vLLM backend rather than silently wrong tokens.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
RotaryFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """How one family's attention module yields q, k, v ``[rows, length, heads, head_dim]`` before rotary."""

    model_type: str
    fused_qkv: bool = False
    """``qkv_proj`` holds q, k and v stacked along the output dimension (Phi-3)."""
    head_norms: bool = False
    """``q_norm`` / ``k_norm`` RMS-normalise each head of q and k before rotary (Qwen3)."""

    @property
    def rotary(self) -> RotaryFn:
        """The family's own ``apply_rotary_pos_emb`` (partial rotary where the family has it)."""
        module = importlib.import_module(f"transformers.models.{self.model_type}.modeling_{self.model_type}")
        return module.apply_rotary_pos_emb

    def project(self, attn: torch.nn.Module, hidden: torch.Tensor, head_dim: int) -> QKV:
        rows, length = hidden.shape[:2]
        if self.fused_qkv:
            q_width = attn.config.num_attention_heads * head_dim
            kv_width = attn.config.num_key_value_heads * head_dim
            q, k, v = attn.qkv_proj(hidden).split([q_width, kv_width, kv_width], dim=-1)
        else:
            q, k, v = attn.q_proj(hidden), attn.k_proj(hidden), attn.v_proj(hidden)
        q, k, v = (x.view(rows, length, -1, head_dim) for x in (q, k, v))
        if self.head_norms:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v


ARCHITECTURES = {
    arch.model_type: arch
    for arch in (
        Architecture(model_type="qwen2"),
        Architecture(model_type="llama"),
        Architecture(model_type="mistral"),
        Architecture(model_type="gemma"),
        Architecture(model_type="qwen3", head_norms=True),
        Architecture(model_type="phi3", fused_qkv=True),
    )
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)


def architecture_of(model: torch.nn.Module, max_len: int) -> Architecture:
    """The model's ``Architecture``, or ``ValueError`` naming what the built-in engine cannot run.

    ``max_len`` is the longest sequence the engine will hold: a sliding window at least that long never
    slides, so full attention is exact; a shorter one would need windowed masks the engine does not have.
    """
    config = model.config
    if config.model_type not in ARCHITECTURES:
        raise ValueError(
            f"model_type {config.model_type!r} is not supported by the built-in engine (it runs "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}); use engine.backend=vllm for this model"
        )
    windows = _sliding_windows(config)
    if windows and min(windows) < max_len:
        raise ValueError(
            f"model_type {config.model_type!r} uses sliding-window attention (window {min(windows)}) shorter "
            f"than the engine's longest sequence ({max_len}); the built-in engine attends to the whole "
            "context: lower engine.max_model_len to the window or use engine.backend=vllm"
        )
    return ARCHITECTURES[config.model_type]


def _sliding_windows(config) -> list[int]:
    """Window sizes of the layers that slide (every layer when the config has no per-layer types)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return []
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return []
    if getattr(config, "use_sliding_window", True) is False:
        return []
    return [int(window)]
