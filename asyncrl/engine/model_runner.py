"""Runs a Hugging Face Qwen2/Llama causal LM over the slot KV cache.

The forward pass is written here (embed → layers → norm → lm_head) but every weight is read from the HF
module objects at call time, so a weight update copied into the HF model is seen at the next step. The
layer structure is the shared Llama family one: q/k/v projections (Qwen2 adds biases), rotary embeddings,
grouped-query attention, o_proj, RMSNorms and a gated MLP; tied embeddings need nothing special because
``lm_head`` is then the embedding tensor itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.scheduler import Chunk, SlotMove

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")

# (layer index, q, k, v) -> attention output; each mode of the runner supplies its own cache handling.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_supported(model: torch.nn.Module) -> None:
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {config.model_type!r} is not supported; use one of {SUPPORTED_MODEL_TYPES}"
        )
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise ValueError("sliding-window attention layers are not supported by the built-in engine")


class ModelRunner:
    """Feeds scheduled chunks through the model, writing their KV, and returns logits where tokens are due."""

    def __init__(self, model: torch.nn.Module, *, num_slots: int, max_len: int) -> None:
        check_supported(model)
        self.model = model
        config = model.config
        first = model.model.layers[0].self_attn
        self.head_dim = first.head_dim
        self.num_kv_heads = config.num_key_value_heads
        param = next(model.parameters())
        self.device = param.device
        self.cache = KVCache(
            num_layers=len(model.model.layers),
            num_slots=num_slots,
            max_len=max_len,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=param.dtype,
            device=self.device,
        )

    @torch.inference_mode()
    def run(self, moves: list[SlotMove], chunks: list[Chunk], num_slots_in_use: int) -> torch.Tensor:
        """Apply slot moves, then return logits ``[num_completing, vocab]`` (float32) for the chunks that
        complete, in chunk order."""
        for move in moves:
            self.cache.move(move.src, move.dst, move.num_positions)
        decode_rows = self._decode([c for c in chunks if c.num_tokens == 1], num_slots_in_use)
        logits = []
        for chunk in chunks:
            row = decode_rows[chunk.seq.slot] if chunk.num_tokens == 1 else self._prefill(chunk)
            if chunk.completes:
                logits.append(row)
        if not logits:
            return torch.empty(0, self.model.config.vocab_size, device=self.device)
        return torch.stack(logits).float()

    def _decode(self, chunks: list[Chunk], num_rows: int) -> dict[int, torch.Tensor]:
        """One token for each chunk, batched over slots ``[0, num_rows)``; idle rows write to scratch."""
        if not chunks:
            return {}
        token_ids = [0] * num_rows
        rope_positions = [0] * num_rows
        write_positions = [self.cache.scratch_position] * num_rows
        for chunk in chunks:
            token_ids[chunk.seq.slot] = chunk.seq.token_ids[chunk.start]
            rope_positions[chunk.seq.slot] = write_positions[chunk.seq.slot] = chunk.start
        length = max(chunk.start for chunk in chunks) + 1
        rope = torch.tensor(rope_positions, device=self.device)
        writes = torch.tensor(write_positions, device=self.device)
        mask = torch.arange(length, device=self.device)[None, :] <= rope[:, None]  # [rows, length]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write_rows(layer, writes, k, v)
            keys, values = self.cache.view(layer, slice(0, num_rows), length)
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask[:, None, None, :], enable_gqa=True
            )

        ids = torch.tensor(token_ids, device=self.device)[:, None]
        hidden = self._forward(ids, rope[:, None], attend)[:, -1]
        return {chunk.seq.slot: hidden[chunk.seq.slot] for chunk in chunks}

    def _prefill(self, chunk: Chunk) -> torch.Tensor:
        """Tokens ``[start, start + n)`` of one sequence; returns the last position's logits."""
        slot, start, end = chunk.seq.slot, chunk.start, chunk.start + chunk.num_tokens
        positions = torch.arange(start, end, device=self.device)
        mask = torch.arange(end, device=self.device)[None, :] <= positions[:, None]  # [n, end], causal

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write_chunk(layer, slot, start, k, v)
            keys, values = self.cache.view(layer, slice(slot, slot + 1), end)
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask[None, None], enable_gqa=True
            )

        ids = torch.tensor(chunk.seq.token_ids[start:end], device=self.device)[None, :]
        return self._forward(ids, positions[None, :], attend)[0, -1]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attend: AttentionFn) -> torch.Tensor:
        """Logits of the last position of each row: ``[rows, 1, vocab]``."""
        inner = self.model.model
        hidden = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(hidden, positions)
        for index, layer in enumerate(inner.layers):
            hidden = hidden + self._attention(
                index, layer.self_attn, layer.input_layernorm(hidden), cos, sin, attend
            )
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(inner.norm(hidden[:, -1:]))

    def _attention(self, index, attn, hidden, cos, sin, attend: AttentionFn) -> torch.Tensor:
        rows, length = hidden.shape[:2]
        q = attn.q_proj(hidden).view(rows, length, -1, self.head_dim).transpose(1, 2)
        k = attn.k_proj(hidden).view(rows, length, -1, self.head_dim).transpose(1, 2)
        v = attn.v_proj(hidden).view(rows, length, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = attend(index, q, k, v)  # [rows, heads, length, head_dim]
        return attn.o_proj(out.transpose(1, 2).reshape(rows, length, -1))
