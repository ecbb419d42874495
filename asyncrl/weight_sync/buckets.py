"""Weight buckets: named tensors packed into byte buffers of bounded size, and the serving-dtype cast.

Key decision: a bucket is one ``uint8`` buffer plus a layout of ``(name, dtype, shape, offset)`` records (byte
offsets, each aligned to ``ALIGN``), built greedily as tensors arrive, so an update streams bucket by bucket and
neither side ever holds more than the buckets in flight. The buffer may be anything a ``uint8`` tensor can
view: memory on the trainer's GPU (the broadcast path), a shared-memory file (the vLLM path), pinned host
memory. A tensor larger than a bucket travels alone in a bucket of its own size: splitting it would make the
receiver reassemble it, a copy of the tensor on the engine side. The buffer's bytes are the tensors' own
bits (``view`` reinterprets, never converts), so unpacking is bit-exact in every dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64
"""Byte alignment of every tensor in a bucket: a view of any dtype (≤ 8 bytes wide) starts on its own width,
and 64 keeps each tensor on its own cache line."""


@dataclass(frozen=True)
class BucketEntry:
    """One tensor of a bucket: ``shape`` elements of ``dtype`` (torch name, no ``torch.``) from byte ``offset``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * getattr(torch, self.dtype).itemsize

    def as_list(self) -> list[Any]:
        """The entry as builtins (what crosses into vLLM's environment, which imports nothing of asyncrl)."""
        return [self.name, self.dtype, list(self.shape), self.offset]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def aligned(num_bytes: int) -> int:
    """``num_bytes`` rounded up to ``ALIGN``: the room a tensor takes in a bucket."""
    return -(-num_bytes // ALIGN) * ALIGN


def layout(named: list[tuple[str, torch.Tensor]]) -> tuple[list[BucketEntry], int]:
    """Entries for ``named`` packed in order, and the bucket's size in bytes."""
    entries, offset = [], 0
    for name, tensor in named:
        dtype = str(tensor.dtype).removeprefix("torch.")
        entries.append(BucketEntry(name, dtype, tuple(tensor.shape), offset))
        offset = aligned(offset + tensor.numel() * tensor.element_size())
    return entries, offset


def group_into_buckets(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    size_of: Callable[[torch.Tensor], int] | None = None,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``named_tensors`` in order, cut into groups of at most ``bucket_bytes`` (a tensor larger than that forms
    a group alone), each tensor counted by ``size_of`` (default: its packed, aligned bytes). Lazy: a group is
    yielded before the next tensor is taken, so a generator that gathers shards gathers one group at a time."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {bucket_bytes}")
    size_of = size_of or (lambda tensor: aligned(tensor.numel() * tensor.element_size()))
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    group: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        nbytes = size_of(tensor)
        if group and size + nbytes > bucket_bytes:
            yield group
            group, size = [], 0
        group.append((name, tensor))
        size += nbytes
    if group:
        yield group


def pack_into(buffer: torch.Tensor, named: list[tuple[str, torch.Tensor]]) -> list[BucketEntry]:
    """Copy ``named`` into ``buffer`` (a 1-D ``uint8`` tensor of at least ``layout(named)``'s size, any device)
    and return their entries. Each copy reinterprets the destination as the tensor's dtype: bits unchanged."""
    entries, size = layout(named)
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < size:
        raise ValueError(
            f"a bucket of {len(named)} tensor(s) needs a 1-D uint8 buffer of >= {size} bytes, got "
            f"{buffer.dtype} of shape {tuple(buffer.shape)}"
        )
    for entry, (_, tensor) in zip(entries, named, strict=True):
        view_of(buffer, entry).copy_(tensor.detach())
    return entries


def view_of(buffer: torch.Tensor, entry: BucketEntry) -> torch.Tensor:
    """The tensor ``entry`` describes, as a view of ``buffer`` (no copy)."""
    span = buffer[entry.offset : entry.offset + entry.nbytes]
    return span.view(getattr(torch, entry.dtype)).view(entry.shape)


def unpack(buffer: torch.Tensor, entries: Iterable[BucketEntry]) -> list[tuple[str, torch.Tensor]]:
    """Every entry's tensor as a view of ``buffer``, checked to lie inside it (``ValueError`` naming it)."""
    named = []
    for entry in entries:
        if entry.offset < 0 or entry.offset % ALIGN or entry.offset + entry.nbytes > buffer.numel():
            raise ValueError(
                f"bucket: tensor {entry.name!r} spans bytes [{entry.offset}, {entry.offset + entry.nbytes}) "
                f"outside the bucket's {buffer.numel()} bytes (or off its {ALIGN}-byte alignment)"
            )
        named.append((entry.name, view_of(buffer, entry)))
    return named


def cast_for_serving(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], dtype: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` in the serving ``dtype``, each floating-point tensor cast once where it lives (the
    trainer's device; a DTensor casts its shard), lazily: a cast is held only until its last name is taken, so
    a consumer that drops each one (a bucket stream) never holds the whole model twice. A tensor under two
    names (tied embeddings) is cast once and both names get that cast, the later name yielded right after the
    first (the only change to the order): held until a name at the end of the model (``lm_head.weight``), the
    cast of a tied embedding (593.5 MiB in bfloat16 at Qwen3-1.7B) would stay alive beside every bucket in
    between. A tensor already in ``dtype``, or not floating point, passes as it is (no copy)."""
    target = _serving_target(dtype)
    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    keys = [_memory_key(tensor) for _, tensor in items]
    order = _partners_adjacent(keys)
    last_use = {keys[index]: position for position, index in enumerate(order)}
    cast: dict[tuple[Any, ...], torch.Tensor] = {}
    for position, index in enumerate(order):
        (name, tensor), key = items[index], keys[index]
        if tensor.dtype == target or not tensor.is_floating_point():
            yield name, tensor
            continue
        converted = cast.pop(key, None)
        if converted is None:
            converted = tensor.detach().to(target)
        if last_use[key] > position:  # the next name shares this memory: keep the cast for it
            cast[key] = converted
        yield name, converted


def _partners_adjacent(keys: list[tuple[Any, ...]]) -> list[int]:
    """Indices of ``keys`` in order, except that every later index with the same key follows the first at once."""
    sharing: dict[tuple[Any, ...], list[int]] = {}
    for index, key in enumerate(keys):
        sharing.setdefault(key, []).append(index)
    return [index for first, key in enumerate(keys) if sharing[key][0] == first for index in sharing[key]]


class ServingCasts:
    """Named tensors in the serving dtype, cast only as they are read: iterating yields ``cast_for_serving``'s
    pairs (each cast made when reached, kept by nobody but the reader; iterated again, cast again).

    Why: a dict of the casts is a whole second copy of the served model beside the copy a transport makes of
    it (``in_process``'s clones, ``colocated``'s blocks), so a publication held the served model twice. Read
    lazily, a transport that keeps each tensor it is handed holds it once: ``in_process`` keeps a fresh cast
    without cloning it (``fresh``), and ``colocated``, which lays its blocks out before it fills them, reads
    ``sources`` with ``served_dtype`` and casts as it copies into the block, so no cast exists apart from it.
    A transport that needs every tensor at once (``list`` of it) still gets them, held once."""

    def __init__(self, named: Mapping[str, torch.Tensor], dtype: str) -> None:
        self.target = _serving_target(dtype)
        self.sources = dict(named)
        """The trainer's own tensors (views of its weights: never written)."""

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return cast_for_serving(self.sources, str(self.target).removeprefix("torch."))

    def served_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        """The dtype ``tensor`` (a source) is served in: ``target`` if it is floating point, else its own."""
        return self.target if tensor.is_floating_point() else tensor.dtype

    def fresh(self, name: str) -> bool:
        """Whether ``name``'s tensor is a cast made for the reader (memory nobody else holds), not the trainer's
        own tensor passed as it is (already in the serving dtype, or not floating point)."""
        return self.served_dtype(self.sources[name]) != self.sources[name].dtype


def _serving_target(dtype: str) -> torch.dtype:
    target = getattr(torch, dtype, None)
    if not isinstance(target, torch.dtype) or not target.is_floating_point:
        raise ValueError(f"serving dtype must be a floating-point torch dtype, got {dtype!r}")
    return target


def _memory_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor's memory (its local shard's for a DTensor): equal for tied names."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return (local.data_ptr(), tensor.dtype, tuple(tensor.shape), local.stride())
