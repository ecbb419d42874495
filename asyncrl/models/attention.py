"""Whether the attention implementation a run names (``model.attn_implementation``) can run where its model is
about to be loaded, checked before any weight is read.

Why: transformers accepts a CUDA-only implementation on a machine without CUDA, or without the flash-attn
package, and fails later: at load with an error that does not name the config key, or inside the first
forward (FlexAttention's missing CPU backward, flash-attn's kernels on CPU tensors). The config refuses what it
can see by itself (``ModelConfig``: ``model.device: cpu``; ``RunConfig``: a float32 forward under flash-attn);
what depends on the machine (is CUDA visible, is the package installed) is checked here, where the model is
loaded, on the machine (or Ray actor) that will run it.
"""

from __future__ import annotations

import torch
from transformers.utils import (
    is_flash_attn_2_available,
    is_flash_attn_3_available,
    is_flash_attn_4_available,
)

from asyncrl.config.model import CUDA_ONLY_ATTENTION, cpu_refusal


class AttentionUnavailable(ValueError):
    """``model.attn_implementation`` names an implementation this machine cannot run: bad input for this
    machine (a ValueError, so the CLI reports it in one line, as it does a config error)."""


_FLASH = {
    "flash_attention_2": (
        is_flash_attn_2_available,
        "flash-attn 2 (pip install flash-attn --no-build-isolation)",
    ),
    "flash_attention_3": (
        is_flash_attn_3_available,
        "flash-attn-3 (built from flash-attention's hopper/ folder)",
    ),
    "flash_attention_4": (is_flash_attn_4_available, "flash-attn-4 (pip install flash-attn-4)"),
}
"""Per flash implementation: transformers' own availability check (the package and CUDA, or the ``kernels``
package's hub fallback, which it then fetches and caches) and what to install."""


def check_attention(attn_implementation: str, device: torch.device, *, cuda: bool | None = None) -> None:
    """Raise ``AttentionUnavailable`` (naming ``model.attn_implementation`` and what to do instead) when
    ``attn_implementation`` cannot train on ``device`` here; return quietly otherwise. ``cuda``: whether this
    machine has a CUDA device (None: ask torch; ``asyncrl doctor`` passes what it probed)."""
    if attn_implementation not in CUDA_ONLY_ATTENTION:
        return
    key = f"model.attn_implementation={attn_implementation!r}"
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if device.type != "cuda" or not cuda:
        raise AttentionUnavailable(
            f"{key} needs CUDA, but the model would run on {device.type} "
            f"({cpu_refusal(attn_implementation)}); use model.attn_implementation: sdpa (or eager) here"
        )
    if attn_implementation in _FLASH:
        available, package = _FLASH[attn_implementation]
        if not available(kernels_fallback_ok=True):
            raise AttentionUnavailable(
                f"{key} needs {package}, which is not installed (nor the kernels package's hub fallback); "
                "install it, or use model.attn_implementation: sdpa or flex_attention"
            )
