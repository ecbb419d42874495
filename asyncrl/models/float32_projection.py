"""A linear layer whose output is float32 whatever its inputs' precision: the vocabulary projection (and the value
head) that the log-probs, entropies and values are taken from, in the trainer and in the built-in engine alike
(here, below both, so that each computes its logits the same way and the engine need not import the trainer).

Why: under autocast or FSDP2's bf16 parameters, ``lm_head(hidden)`` returns bf16 logits, and a ``.float()`` after
it is too late: at a vocabulary of 151,936 with a top logit near 22 (bf16 step 0.125 there), rounding the logits
moves a sampled token's log-prob by 0.009 on average and up to 0.06, noise in every importance ratio. Here the
products of the inputs *as the layer would have used them* (cast to the autocast dtype, else the weight's own) are
accumulated and returned in float32, so only the inputs are low precision, never the output.

Key decision: nothing the size of the whole weight is ever created (an fp32 copy of a 151,936 × 4,096 head is
2.5 GB). Where the weight multiplies as it is, forward takes it whole in one product: on CUDA a bf16/fp16 weight
goes to cuBLAS with float32 output (``torch.mm(..., out_dtype=torch.float32)``: tensor-core speed, fp32
accumulate), and a float32 weight in float32 is ``F.linear``'s own product (so a float32 engine's logits are
what its bias-free ``lm_head`` gave, bit for bit). Where it must be cast (to the autocast dtype, or upcast on CPU,
which has no ``out_dtype`` kernel in torch 2.13), it is taken a slice of ``SLICE_ROWS`` output rows at a time.
Backward always slices, and is the usual mixed-precision one: the float32 output gradient is rounded to the
compute dtype, as autocast's backward would, and every product accumulates in float32.

The engine calls it under ``torch.inference_mode`` (forward only: nothing kept for a backward) and inside the
CUDA-graph capture of its decode step (``engine.static_decode``): its shapes follow the input's alone and nothing
in it reads a tensor back to the host, so the captured kernels are the same at every replay.

Cost: where the weight's dtype is not the compute dtype (float32 masters under autocast), every call casts the
weight slice by slice, one read of the weight per chunk and pass, where autocast cached one bf16 copy per forward;
on CPU a half-precision weight is upcast slice by slice at every call (a bf16 engine on CPU: every step, where
``engine.dtype: auto`` serves float32 on CPU and needs no cast). The CUDA path is not run here (no GPU):
``scripts/gpu-smoke.sh`` runs ``test_float32_projection.py`` and ``test_engine_float32_logits.py`` on CUDA (the
latter captures the engine's decode graphs over it), and neither its speed nor its memory has been measured.
"""

from __future__ import annotations

import torch
from torch import nn

SLICE_ROWS = 8192
"""Output rows of the weight taken at once: bounds the cast slice (8,192 × hidden × 6 B: 201 MB at hidden 4,096
on CPU) and the float32 [tokens, 8,192] product that is copied into the output."""
_OUT_DTYPE_MM = ("cuda",)
"""Devices whose ``torch.mm`` takes bf16/fp16 inputs with ``out_dtype=torch.float32`` (torch's documentation: CUDA;
CPU raises NotImplementedError in torch 2.13)."""


def float32_linear(x: torch.Tensor, linear: nn.Module, slice_rows: int = SLICE_ROWS) -> torch.Tensor:
    """``linear(x)`` [n, out] in float32, from ``x`` [n, in] and ``linear``'s weight (and bias) in the dtype the
    layer would compute in: autocast's where autocast is on for ``x``'s device, else the weight's. Gradients flow
    to ``x``, the weight and the bias, each in its own dtype."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(
            f"the float32 projection needs a plain nn.Linear, got {type(linear).__name__} (is the LM head "
            "wrapped, e.g. named in trainer.lora.target_modules?)"
        )
    device_type = x.device.type
    dtype = (
        torch.get_autocast_dtype(device_type)
        if torch.is_autocast_enabled(device_type)
        else linear.weight.dtype
    )
    return _Float32Linear.apply(x, linear.weight, linear.bias, dtype, slice_rows)


class _Float32Linear(torch.autograd.Function):
    """x [n, in] @ weightᵀ [in, out] (+ bias) with float32 output; ``dtype`` is what the inputs are cast to."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype, slice_rows):  # type: ignore[override]
        ctx.save_for_backward(x, weight, bias)
        ctx.dtype, ctx.slice_rows = dtype, slice_rows
        with torch.autocast(x.device.type, enabled=False):
            x_c = x.to(dtype)
            if _multiplies_as_is(weight, dtype):
                out = _mm_float32(x_c, weight.T)
            else:
                out = x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)
                for start in range(0, weight.shape[0], slice_rows):
                    rows = slice(start, start + slice_rows)
                    out[:, rows] = _mm_float32(x_c, weight[rows].to(dtype).T)
            if bias is not None:
                out += bias.to(dtype).float()
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, weight, bias = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        with torch.autocast(x.device.type, enabled=False):
            x_c = x.to(ctx.dtype)
            grad_x32 = x.new_zeros(x.shape, dtype=torch.float32) if need_x else None
            grad_weight = torch.empty_like(weight) if need_weight else None
            for start in range(0, weight.shape[0], ctx.slice_rows):
                rows = slice(start, start + ctx.slice_rows)
                grad_c = grad_out[:, rows].to(ctx.dtype)
                if grad_x32 is not None:
                    grad_x32 += _mm_float32(grad_c, weight[rows].to(ctx.dtype))
                if grad_weight is not None:
                    grad_weight[rows] = _mm_float32(grad_c.T, x_c)
            if grad_x32 is not None:
                grad_x = grad_x32.to(x.dtype)
            if bias is not None and need_bias:
                grad_bias = grad_out.sum(0).to(bias.dtype)
        return grad_x, grad_weight, grad_bias, None, None


def _multiplies_as_is(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``_mm_float32`` takes ``weight`` in ``dtype`` without a copy of it: float32, or half precision
    where ``torch.mm`` has a float32-output kernel."""
    if weight.dtype != dtype:
        return False
    return dtype == torch.float32 or (
        weight.device.type in _OUT_DTYPE_MM and dtype in (torch.bfloat16, torch.float16)
    )


def _mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b accumulated and returned in float32 (a and b share one dtype)."""
    if a.device.type in _OUT_DTYPE_MM and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())
