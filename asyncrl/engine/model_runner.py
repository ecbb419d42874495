"""Runs a Hugging Face decoder-only causal LM of the Llama family over the slot KV cache.

The forward pass is written here (embed → layers → norm → lm_head) but every weight is read from the HF
module objects at call time, so a weight update copied into the HF model is seen at the next step. The
layer structure is the shared Llama family one: q/k/v projections, rotary embeddings, grouped-query
attention, o_proj, RMSNorms and a gated MLP; what a family changes in it (fused projections, per-head q/k
norms, partial rotary) is named in ``architectures.py``. Tied embeddings need nothing special because
``lm_head`` is then the embedding tensor itself.

The logits are float32 from the serving-dtype head and hidden states (``models.float32_projection``, the trainer's
own projection): rounding them to bf16 first moved a sampled token's log-prob by up to ~0.06 nats at a 152k
vocabulary, both in what is sampled and in the behaviour log-prob the trainer's importance ratios divide by.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from asyncrl.engine.architectures import architecture_of
from asyncrl.engine.capture_turns import CaptureTurns
from asyncrl.engine.decode_plan import Group, attention_groups, attention_positions
from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.scheduler import Chunk, SlotMove, SlotSwap
from asyncrl.engine.static_decode import StaticDecode
from asyncrl.models.float32_projection import float32_linear

# (layer index, q, k, v) -> attention output; each mode of the runner supplies its own cache handling.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ModelRunner:
    """Feeds scheduled chunks through the model, writing their KV, and returns logits where tokens are due.

    A step costs one batched decode pass plus one padded pass for all its prefill chunks (more only when
    their lengths differ widely, see ``padding_groups``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        num_slots: int,
        max_len: int,
        decode_graphs: str = "off",
        allocate_kv: bool = True,
        device: torch.device | None = None,
        adapters_fingerprint: Callable[[], tuple[int, ...]] = tuple,
        capture_turns: CaptureTurns | None = None,
    ) -> None:
        """``allocate_kv``: False leaves the KV pool unallocated until ``cache.restore`` (an engine started
        asleep). ``device``: where the model runs (default: where its parameters are; an engine started
        asleep at level 2 may hold them in host memory until its wake). ``adapters_fingerprint``: what the
        decode step reads of the served LoRA adapters besides the weights (``engine.adapters``), part of what
        a captured decode graph depends on. ``capture_turns``: what keeps its decode graphs' captures apart from
        a trainer on the same device in this process (``engine.capture_turns``; None: no such trainer)."""
        self.architecture = architecture_of(model, max_len)
        self.rotary = self.architecture.rotary
        self.model = model
        self.scale = model.model.layers[0].self_attn.scaling
        dims = kv_dimensions(model)
        self.head_dim = dims["head_dim"]
        self.query_group = model.config.num_attention_heads // dims["num_kv_heads"]
        """Query heads per KV head (``grouped_attention``)."""
        self.device = device or next(model.parameters()).device
        self.cache = KVCache(
            num_slots=num_slots, max_len=max_len, device=self.device, allocate=allocate_kv, **dims
        )
        self.cos_sin = RotaryTable(
            model.model.rotary_emb, max_len=max_len, dtype=dims["dtype"], device=self.device
        )
        self.adapters_fingerprint = adapters_fingerprint
        self.decode_attention_positions = 0
        """KV positions read by decode attention so far, per layer (``decode_plan.attention_positions``):
        the attention work the plans cost, counted rather than timed."""
        self.static: StaticDecode | None = None
        """Decode at bucketed static shapes (``engine.decode_graphs``); None: at each step's own shapes."""
        if decode_graphs == "on" or (decode_graphs == "auto" and self.device.type == "cuda"):
            self.static = StaticDecode(
                self._decode_rows,
                num_slots=num_slots,
                max_len=max_len,
                device=self.device,
                capture=self.device.type == "cuda",
                fingerprint=self._addresses,
                turns=capture_turns,
            )

    @torch.inference_mode()
    def run(
        self, moves: list[SlotMove | SlotSwap], chunks: list[Chunk], num_slots_in_use: int
    ) -> torch.Tensor:
        """Apply slot moves and swaps, then return logits ``[num_completing, vocab]`` (float32) for the chunks that
        complete, in chunk order."""
        for move in moves:
            if isinstance(move, SlotSwap):
                self.cache.swap(move.a, move.b, move.num_positions)
            else:
                self.cache.move(move.src, move.dst, move.num_positions)
        rows = self._decode([c for c in chunks if c.num_tokens == 1], num_slots_in_use)
        prefills = [c for c in chunks if c.num_tokens > 1]
        if prefills:
            rows.update(self._prefill(prefills))
        logits = [rows[chunk.seq.slot] for chunk in chunks if chunk.completes]
        if not logits:
            return torch.empty(0, self.model.config.vocab_size, device=self.device)
        return torch.stack(logits)

    def _decode(self, chunks: list[Chunk], num_rows: int) -> dict[int, torch.Tensor]:
        """One token for each chunk, batched over slots ``[0, num_rows)``; idle rows write to scratch.
        Each row attends over its own context's group (``decode_plan``), not the batch's longest."""
        if not chunks:
            return {}
        token_ids = [0] * num_rows
        rope_positions = [0] * num_rows
        write_positions = [self.cache.scratch_position] * num_rows
        for chunk in chunks:
            token_ids[chunk.seq.slot] = chunk.seq.token_ids[chunk.start]
            rope_positions[chunk.seq.slot] = write_positions[chunk.seq.slot] = chunk.start
        if self.static is not None:
            shape = self.static.shape_of(rope_positions)
            groups = shape[1]
            logits = self.static.run(token_ids, rope_positions, write_positions, shape)
        else:
            needs = [position + 1 for position in rope_positions]
            groups = attention_groups(needs, self.cache.max_len)
            inputs = torch.tensor([token_ids, rope_positions, write_positions], device=self.device)
            logits = self._decode_rows(inputs, groups)
        self.decode_attention_positions += attention_positions(groups)
        return {chunk.seq.slot: logits[chunk.seq.slot] for chunk in chunks}

    def _decode_rows(self, inputs: torch.Tensor, groups: tuple[Group, ...]) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of one decode token per slot ``[0, rows)``: ``inputs`` ``[3, rows]`` holds
        each row's token id, rope position and KV write position; ``groups`` tile the rows, each attending
        over positions ``[0, its length)`` of its own slots, the mask hiding what lies past a row's position.
        Allocates nothing outside the step, so ``StaticDecode`` can capture it."""
        rows = inputs.shape[1]
        ids, rope, writes = inputs[0, :, None], inputs[1, :, None], inputs[2]
        masks = [  # [group rows, 1, length]: one row of visible positions, shared by the row's query heads
            (torch.arange(length, device=inputs.device)[None, :] <= rope[start:end])[:, None]
            for start, end, length in groups
        ]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write_rows(layer, writes, k, v)
            outs = []
            for (start, end, length), mask in zip(groups, masks, strict=True):
                keys, values = self.cache.view(layer, slice(start, end), length)
                outs.append(grouped_attention(q[start:end], keys, values, mask, self.scale))
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        last = torch.zeros(rows, dtype=torch.long, device=inputs.device)
        return self._forward(ids, rope, attend, last)

    def _addresses(self) -> tuple[int, ...]:
        """Where the KV pool and the weights live, and the adapters' layout; a captured decode graph is valid
        only while they stay."""
        inner = self.model.model
        return (
            self.cache.keys[0].data_ptr(),
            self.cache.values[-1].data_ptr(),
            inner.embed_tokens.weight.data_ptr(),
            inner.norm.weight.data_ptr(),
            self.model.lm_head.weight.data_ptr(),
            *self.adapters_fingerprint(),
        )

    def _prefill(self, chunks: list[Chunk]) -> dict[int, torch.Tensor]:
        """Every prefill chunk of the step, in as few padded forward passes as ``padding_groups`` allows;
        a chunk repeating another's prompt (the n samples of a GRPO group) copies its KV and logits instead."""
        unique, copies = shared_prefills(chunks)
        rows: dict[int, torch.Tensor] = {}
        for group in padding_groups([chunk.num_tokens for chunk in unique]):
            rows.update(self._prefill_group([unique[i] for i in group]))
        for source, copy in copies:
            self.cache.move(source.seq.slot, copy.seq.slot, copy.num_tokens)
            rows[copy.seq.slot] = rows[source.seq.slot]
        return rows

    def _prefill_group(self, chunks: list[Chunk]) -> dict[int, torch.Tensor]:
        """One forward over several chunks, right-padded to the longest; row ``r`` holds tokens
        ``[start, start + n)`` of its sequence. Returns each row's logits at its last real token, by slot.

        Real queries see only their own slot's positions at or before their own, so padding never leaks
        into them; padded tokens repeat their row's last position (rope stays within the row's range) and
        write their KV to the scratch position, which no real query reads.
        """
        device = self.device
        width = max(chunk.num_tokens for chunk in chunks)
        length = max(chunk.start + chunk.num_tokens for chunk in chunks)
        starts = torch.tensor([chunk.start for chunk in chunks], device=device)
        counts = torch.tensor([chunk.num_tokens for chunk in chunks], device=device)
        slots = torch.tensor([chunk.seq.slot for chunk in chunks], device=device)
        offsets = torch.arange(width, device=device)
        positions = starts[:, None] + torch.minimum(offsets[None, :], counts[:, None] - 1)  # [rows, width]
        writes = torch.where(offsets[None, :] < counts[:, None], positions, self.cache.scratch_position)
        mask = torch.arange(length, device=device)[None, None, :] <= positions[:, :, None]
        mask = mask.repeat(1, self.query_group, 1)  # [rows, group × width, length]: ``grouped_attention``

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write_positions(layer, slots, writes, k, v)
            keys, values = self.cache.gather(layer, slots, length)
            return grouped_attention(q, keys, values, mask, self.scale)

        ids = torch.tensor([padded_tokens(chunk, width) for chunk in chunks], device=device)
        logits = self._forward(ids, positions, attend, counts - 1)
        return {chunk.seq.slot: logits[row] for row, chunk in enumerate(chunks)}

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attend: AttentionFn, last: torch.Tensor
    ) -> torch.Tensor:
        """Float32 logits ``[rows, vocab]`` of each row's position ``last[row]``, never rounded to the serving
        dtype (``float32_linear``: products of the serving-dtype head and hidden state, accumulated and returned
        in float32; one float32-output GEMM on CUDA, the head upcast slice by slice on CPU, never a float32 copy
        of all of it)."""
        inner = self.model.model
        hidden = inner.embed_tokens(ids)
        cos, sin = self.cos_sin(hidden, positions)
        for index, layer in enumerate(inner.layers):
            hidden = hidden + self._attention(
                index, layer.self_attn, layer.input_layernorm(hidden), cos, sin, attend
            )
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return float32_linear(inner.norm(hidden), self.model.lm_head)

    def _attention(self, index, attn, hidden, cos, sin, attend: AttentionFn) -> torch.Tensor:
        rows, length = hidden.shape[:2]
        q, k, v = (x.transpose(1, 2) for x in self.architecture.project(attn, hidden, self.head_dim))
        q, k = self.rotary(q, k, cos, sin)
        out = attend(index, q, k, v)  # [rows, heads, length, head_dim]
        return attn.o_proj(out.transpose(1, 2).reshape(rows, length, -1))


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention ``[rows, heads, width, head_dim]`` of ``q`` over ``keys`` / ``values``
    ``[rows, kv_heads, length, head_dim]``, with the query heads that share a KV head laid out as extra query
    positions of that head, ``[rows, kv_heads, group × width, head_dim]`` head-major (HF's ``repeat_kv``
    order), so that SDPA runs plain multi-head attention over the keys and values as they are: no
    ``enable_gqa``, no expanded copy of them. ``mask`` ``[rows, group × width, length]`` holds each grouped
    query position's visible keys (the ``width`` rows repeated per group, ``Tensor.repeat``), or
    ``[rows, 1, length]`` when a row's queries all see the same keys (decode: ``width`` 1).

    Why, on CUDA (read, not measured): torch 2.13's own ``scaled_dot_product_attention`` docstring says GQA
    "works only for Flash_attention and math kernel on CUDA", and flash refuses any ``attn_mask``
    (``sdp_utils.cpp``, ``check_for_attn_mask``). The 2.13 wheel's headers agree: its memory-efficient
    kernel reads K/V at the query's head index (``kernel_forward.h``), and ``sdp_utils_cpp.h`` predates the
    memory-efficient GQA of pytorch#191085 (an older upstream ``sdp_utils.cpp``, the one read, passes
    ``supports_gqa=false`` for that kernel). So a masked ``enable_gqa`` call, the prefill's before this, fell
    to the math kernel, which expands K/V to every query head and materialises float32 scores
    ``[rows, heads, width, length]``. This form is masked MHA: the memory-efficient kernel (head size a
    multiple of 8 in bf16, unit last stride), or cuDNN where torch ranks it first. Its price, for prefill: the
    mask repeated ``group`` times (once a step, not per layer) and a copy of ``q`` (the reshape crosses the
    transposed head and position dimensions), both far smaller than the scores. The GPU kit records the
    kernel a prefill chunk really dispatched to (``scripts/gpu_checks/engine_speed.py``)."""
    rows, heads, width, head_dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(rows, kv_heads, heads // kv_heads * width, head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask[:, None], scale=scale)
    return out.reshape(rows, heads, width, head_dim)


def kv_dimensions(model: torch.nn.Module) -> dict[str, Any]:
    """The KV pool's per-slot dimensions for ``model``: layers, KV heads, head size and dtype."""
    return {
        "num_layers": len(model.model.layers),
        "num_kv_heads": model.config.num_key_value_heads,
        "head_dim": model.model.layers[0].self_attn.head_dim,
        "dtype": next(model.parameters()).dtype,
    }


def padded_tokens(chunk: Chunk, width: int) -> list[int]:
    """The chunk's token ids, right-padded with 0 to ``width``."""
    tokens = chunk.seq.token_ids[chunk.start : chunk.start + chunk.num_tokens]
    return tokens + [0] * (width - len(tokens))


def shared_prefills(chunks: list[Chunk]) -> tuple[list[Chunk], list[tuple[Chunk, Chunk]]]:
    """Split chunks into those to compute and (source, copy) pairs whose KV and logits the source gives.

    Only chunks starting at position 0 are shared: their KV depends on nothing but their tokens and the
    current weights, whereas a later chunk attends to KV that may predate a weight update.
    """
    first: dict[tuple[int, ...], Chunk] = {}
    unique, copies = [], []
    for chunk in chunks:
        key = tuple(chunk.seq.token_ids[: chunk.num_tokens])
        if chunk.start == 0 and key in first:
            copies.append((first[key], chunk))
            continue
        if chunk.start == 0:
            first[key] = chunk
        unique.append(chunk)
    return unique, copies


def padding_groups(lengths: list[int], max_padding: float = 2.0) -> list[list[int]]:
    """Indices of chunks to prefill together, longest first.

    A group's padded size (rows × its longest chunk) stays within ``max_padding`` × its real tokens, so
    similar-length chunks share one forward pass while one long chunk is not padded against many short
    ones. Lengths are sorted descending, so once a chunk does not fit no shorter one would: greedy is exact.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    real = 0
    for index in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_padding * (real + lengths[index]):
            groups[-1].append(index)
            real += lengths[index]
        else:
            groups.append([index])
            real = lengths[index]
    return groups


class RotaryTable:
    """cos/sin of every position the engine can reach, computed once by the model's own rotary module and looked
    up per step. Recomputing them each step is a dozen small ops, a visible share of a small model's decode step
    (a profile of the tiny default model's generation put ~7 % there).

    Bit-identical to the module: each entry is one product of a frequency and a position, then cos/sin and the
    rope's scaling, the same arithmetic whatever the batch's shape. Rope types whose frequencies depend on the
    batch's longest position (dynamic NTK, LongRoPE) are not tabulated: the module computes them per step.
    """

    def __init__(
        self, rotary_emb: torch.nn.Module, *, max_len: int, dtype: torch.dtype, device: torch.device
    ):
        self.rotary_emb = rotary_emb
        self.table: tuple[torch.Tensor, torch.Tensor] | None = None
        rope_type = getattr(rotary_emb, "rope_type", "default")
        if "dynamic" not in rope_type and rope_type != "longrope":
            with torch.no_grad():
                positions = torch.arange(max_len + 1, device=device)[None]  # the KV scratch position too
                cos, sin = rotary_emb(torch.zeros(1, dtype=dtype, device=device), positions)
            self.table = (cos[0], sin[0])

    def __call__(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[rows, length, rotary_dim]`` of ``positions`` ``[rows, length]``."""
        if self.table is None:
            return self.rotary_emb(hidden, positions)
        cos, sin = self.table
        return cos[positions], sin[positions]
