"""Sequence packing: the real tokens of a right-padded micro-batch concatenated into a few rows, so the model
never runs on padding.

Why: RL batches are long-tailed, so a padded ``[B, T]`` batch is mostly padding (two thirds on the
generation-bound workload) and the decoder pays for every padded position. Packed, each sample keeps its own
position ids (restarting at 0) and ``attention_mask=None``; the loss and log-prob alignment stay in the padded
layout (cheap, element-wise): only the decoder body runs packed, and its hidden states are scattered back.

What each attention implementation (``model.attn_implementation``) does with packed rows, read from the
installed transformers (5.23: ``masking_utils.create_causal_mask`` / ``find_packed_sequence_indices``,
``modeling_flash_attention_utils._flash_attention_forward``):

- ``sdpa`` and ``eager``: with ``attention_mask=None``, a position id that does not follow its neighbour by 1
  starts a new sample, and the mask becomes block-diagonal causal: a dense ``[rows, 1, W, W]`` tensor built once
  per forward (bool for sdpa, float for eager). torch's sdpa converts it to an additive float mask of the
  query's dtype in every layer's call and keeps that for backward (measured on CPU: ~4 B × W² per row per
  layer in float32), and with any mask CUDA cannot use its flash kernel (memory-efficient or math instead).
  Eager also keeps every head's ``W × W`` softmax per layer. Hence rows of at most ``row_tokens``.
- ``flex_attention``: the same restarts become a document-id ``mask_mod`` (``packed_sequence_mask_function``
  and'ed with causal) compiled into a block-sparse ``BlockMask`` (``create_block_mask(_compile=True)``); whole
  blocks across samples are skipped, so the cost is blocks, not ``W²``. Rows are still ``row_tokens`` long.
  Its backward is CUDA-only in torch 2.13 (the forward runs compiled on CPU; the config refuses it there).
- ``flash_attention_2/3/4``: no mask at all; the kernel reads the restarts as variable-length boundaries
  (``cu_seqlens``), but only when the batch is ONE row (``_is_packed_sequence`` returns False for
  ``batch_size != 1``): with several rows it would attend causally across the samples of each row. So under
  flash every sample goes into one row (``rows_for``), which costs no ``W²`` term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.config.model import FLASH_ATTENTION


@dataclass(frozen=True)
class Packing:
    """Where each real token of a padded ``[B, T]`` batch lives in the packed ``[R, W]`` rows."""

    input_ids: torch.Tensor  # [R, W] packed token ids (tail of a row: pad id)
    position_ids: torch.Tensor  # [R, W] restarting at 0 for every sample (the tail is its own segment)
    padded_index: tuple[torch.Tensor, torch.Tensor]  # (b, t) of every real token, in packing order
    packed_index: tuple[torch.Tensor, torch.Tensor]  # (r, w) of the same tokens
    padded_shape: tuple[int, int]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """``[R, W, ...]`` values back to ``[B, T, ...]`` (zeros at padding); differentiable."""
        out = packed.new_zeros(*self.padded_shape, *packed.shape[2:])
        return out.index_put(self.padded_index, packed[self.packed_index])


def rows_for(attn_implementation: str, row_tokens: int, real_tokens: int) -> int:
    """The longest row to pack ``real_tokens`` into under ``attn_implementation``: ``row_tokens``, or all of
    them in one row for flash-attn, which separates packed samples only within a batch of one row."""
    return max(row_tokens, real_tokens) if attn_implementation in FLASH_ATTENTION else row_tokens


def plan_rows(lengths: list[int], row_tokens: int) -> list[list[int]]:
    """Sample indices per row, first-fit by decreasing length, each row at most ``max(row_tokens, longest)``."""
    capacity = max([row_tokens, *lengths])
    rows: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((r for r, room in enumerate(free) if room >= lengths[index]), None)
        if slot is None:
            rows.append([])
            free.append(capacity)
            slot = len(rows) - 1
        rows[slot].append(index)
        free[slot] -= lengths[index]
    return rows


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, row_tokens: int, pad_token_id: int = 0
) -> Packing:
    """Pack the right-padded ``input_ids`` (real tokens where ``attention_mask`` is 1) into rows."""
    lengths = attention_mask.sum(dim=1).tolist()
    rows = plan_rows(lengths, row_tokens)
    width = max(sum(lengths[i] for i in row) for row in rows)
    device = input_ids.device
    packed_ids = torch.full((len(rows), width), pad_token_id, dtype=input_ids.dtype, device=device)
    positions = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    b_idx, t_idx, r_idx, w_idx = [], [], [], []
    for r, row in enumerate(rows):
        offset = 0
        for b in row:
            n = lengths[b]
            packed_ids[r, offset : offset + n] = input_ids[b, :n]
            positions[r, offset : offset + n] = torch.arange(n, device=device)
            b_idx += [b] * n
            t_idx += range(n)
            r_idx += [r] * n
            w_idx += range(offset, offset + n)
            offset += n
        positions[r, offset:] = torch.arange(width - offset, device=device)  # the tail: one padding segment

    def index(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return Packing(
        input_ids=packed_ids,
        position_ids=positions,
        padded_index=(index(b_idx), index(t_idx)),
        packed_index=(index(r_idx), index(w_idx)),
        padded_shape=(input_ids.shape[0], input_ids.shape[1]),
    )
