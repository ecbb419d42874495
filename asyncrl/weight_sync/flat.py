"""Flat weights: a state dict as one contiguous buffer per dtype plus a manifest, carrying its version.

Two holders of one layout: ``FlatWeights`` (host numpy buffers: what the object store carries) and
``DeviceBucket`` (flat ``uint8`` torch tensors on one device: what the broadcast transport packs and
receives, on the GPU under NCCL). ``unpack_state`` views either, so an engine applies both through one path.

Key decision: ``FlatWeights``' buffers are plain numpy arrays of unsigned integers of the dtype's width (bfloat16 has no numpy
dtype, so every dtype travels as raw ``uint8/16/32/64`` words). Ray's object store hands numpy buffers to a
reader zero-copy (a 10 MiB get ≈ 0.2 ms, against 6-46 ms for a dict of torch tensors, MACHINE-NOTES), and
``unpack_state`` turns them back into tensors that are views, not copies. Memory shared by two names (tied
embeddings passed as views of one matrix) is stored once and both names view it.

Manifest contract, checked by ``check_flat`` before anything is viewed: names are unique; every entry's
dtype has a buffer; its span ``[offset, offset + numel)`` lies inside that buffer; and each buffer is tiled
exactly by the distinct spans of its entries (no gap, no partial overlap, nothing left over), so a truncated
buffer or a wrong shape is an error naming the tensor, never a silently shifted weight.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from asyncrl.weight_sync.buckets import ServingCasts

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]

_CARRIERS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
"""Element width in bytes → the numpy dtype whose words carry that dtype's bits."""


@dataclass(frozen=True, kw_only=True)
class TensorEntry:
    """Where one named tensor lives: ``numel`` elements from ``offset`` (in elements) of its dtype's buffer."""

    name: str
    dtype: str
    """Torch dtype name without the ``torch.`` prefix, e.g. ``float32``, ``bfloat16``."""
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True, kw_only=True, eq=False)
class FlatWeights:
    """Weights of policy ``version``: ``buffers[dtype]`` holds the elements of every entry of that dtype."""

    version: int
    manifest: tuple[TensorEntry, ...]
    buffers: dict[str, np.ndarray]
    """dtype name → 1-D array of the unsigned integer type as wide as that dtype (see ``_CARRIERS``)."""

    @property
    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers.values())

    @property
    def names(self) -> list[str]:
        return [entry.name for entry in self.manifest]

    @property
    def payload_bytes(self) -> int:
        """Bytes of the buffers the manifest tiles, read from the manifest alone (so it survives
        ``without_buffers``): what this bucket moves when it travels."""
        ends: dict[str, int] = {}
        for entry in self.manifest:
            ends[entry.dtype] = max(ends.get(entry.dtype, 0), entry.end)
        return sum(end * getattr(torch, dtype).itemsize for dtype, end in ends.items())

    def without_buffers(self) -> FlatWeights:
        """The version and manifest only: what a publisher keeps of a bucket once it is placed."""
        return replace(self, buffers={})


def pack_state(named_tensors: NamedTensors | ServingCasts, version: int) -> FlatWeights:
    """Copy ``named_tensors`` (any device, any layout) into fresh flat buffers; the result owns its memory.
    Serving casts (``ServingCasts``) are cast as they are copied, so no cast exists beside the buffers."""
    items, served = sources_of(named_tensors)
    entries, sizes, owners = _layout(items, served)
    buffers = {dtype: np.empty(size, _carrier(dtype)) for dtype, size in sizes.items()}
    typed = {dtype: _typed(buffer, dtype) for dtype, buffer in buffers.items()}
    with torch.no_grad():
        for (_, tensor), entry, owner in zip(items, entries, owners, strict=True):
            if owner:  # copy_ casts into the buffer's dtype: what ``cast_for_serving`` gives, bit for bit
                typed[entry.dtype][entry.offset : entry.end].copy_(tensor.detach().reshape(-1))
    return FlatWeights(version=version, manifest=tuple(entries), buffers=buffers)


def sources_of(
    named_tensors: NamedTensors | ServingCasts,
) -> tuple[list[tuple[str, torch.Tensor]], Callable[[torch.Tensor], torch.dtype] | None]:
    """What a packer lays out and copies from: the pairs as given, or, for ``ServingCasts``, the trainer's own
    tensors and the dtype each is served in (``_layout``'s ``served``), so the copy itself casts.

    Why: listing ``ServingCasts`` makes every cast of the bucket at once, a second served copy beside the
    packed one (inline, the bucket is the whole model)."""
    if isinstance(named_tensors, ServingCasts):
        return list(named_tensors.sources.items()), named_tensors.served_dtype
    return list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors), None


@dataclass(frozen=True, kw_only=True, eq=False)
class DeviceBucket:
    """``FlatWeights``' layout with torch buffers: ``buffers[dtype]`` is a flat ``uint8`` tensor (on any one
    device: the GPU under NCCL, host memory under gloo or for a staged receive) holding every entry of that
    dtype, so a bucket can travel and be applied where it is, never through numpy."""

    version: int
    manifest: tuple[TensorEntry, ...]
    buffers: dict[str, torch.Tensor]

    def to_host(self) -> FlatWeights:
        """A host copy as ``FlatWeights`` (for the catch-up that trainer rank 0 keeps with engine recovery): a
        device → host copy per buffer, so only ``publish_weights(retain=True)`` pays it."""
        buffers = {
            dtype: buffer.cpu().numpy().view(carrier_of(dtype)) for dtype, buffer in self.buffers.items()
        }
        return FlatWeights(version=self.version, manifest=self.manifest, buffers=buffers)

    def without_buffers(self) -> FlatWeights:
        """The version and manifest only: what the publisher reports once the bucket is sent."""
        return FlatWeights(version=self.version, manifest=self.manifest, buffers={})


def unpack_state(flat: FlatWeights | DeviceBucket) -> dict[str, torch.Tensor]:
    """Tensors by name that view ``flat``'s buffers (no copy, on the buffers' device), after ``check_flat``.

    The views share memory with the buffers, which the object store hands out read-only: copy from them
    (as an engine's weight update does), never write into them.
    """
    check_flat(flat)
    typed = {dtype: _typed(buffer, dtype) for dtype, buffer in flat.buffers.items()}
    return {e.name: typed[e.dtype][e.offset : e.end].view(e.shape) for e in flat.manifest}


def check_flat(flat: FlatWeights | DeviceBucket) -> None:
    """``ValueError`` naming the first broken part of the manifest contract (module docstring)."""
    if not isinstance(flat.version, int):
        raise ValueError(f"flat weights: version must be an int, got {flat.version!r}")
    for dtype, buffer in flat.buffers.items():
        _check_buffer(dtype, buffer)
    names = [entry.name for entry in flat.manifest]
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"flat weights: tensor name(s) {duplicates} appear more than once in the manifest")
    for entry in flat.manifest:
        _check_entry(entry, flat.buffers)
    for dtype, buffer in flat.buffers.items():
        _check_tiling(dtype, _elements(buffer, dtype), [e for e in flat.manifest if e.dtype == dtype])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _layout(
    items: list[tuple[str, torch.Tensor]],
    served: Callable[[torch.Tensor], torch.dtype] | None = None,
) -> tuple[list[TensorEntry], dict[str, int], list[bool]]:
    """Each tensor's entry, each dtype's buffer size, and whether the tensor owns (must fill) its span; with
    ``served``, each entry in the dtype it gives the tensor (the filler casts as it copies)."""
    sizes: dict[str, int] = {}
    seen: dict[tuple, TensorEntry] = {}
    entries, owners, names = [], [], set()
    for name, tensor in items:
        if name in names:
            raise ValueError(f"pack_state: tensor {name!r} is given twice")
        names.add(name)
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if key in seen:  # the same memory under a second name (tied embeddings): store it once
            entries.append(replace(seen[key], name=name))
            owners.append(False)
            continue
        dtype = dtype_name(tensor.dtype if served is None else served(tensor))
        _carrier(dtype, name)
        entry = TensorEntry(name=name, dtype=dtype, shape=tuple(tensor.shape), offset=sizes.get(dtype, 0))
        sizes[dtype] = entry.end
        seen[key] = entry
        entries.append(entry)
        owners.append(True)
    return entries, sizes, owners


def _carrier(dtype: str, name: str | None = None) -> np.dtype:
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"flat weights: unknown dtype {dtype!r}")
    width = torch_dtype.itemsize
    if width not in _CARRIERS or torch_dtype.is_complex:
        where = f"tensor {name!r} has " if name else ""
        raise ValueError(f"flat weights: {where}dtype {dtype} that cannot travel as flat words")
    return _CARRIERS[width]


def _typed(buffer: np.ndarray | torch.Tensor, dtype: str) -> torch.Tensor:
    """The buffer's words (or bytes, a ``DeviceBucket``'s) reinterpreted as ``dtype`` elements, sharing memory."""
    if isinstance(buffer, torch.Tensor):
        return buffer.view(getattr(torch, dtype))
    with warnings.catch_warnings():  # object-store buffers are read-only; the views are only ever read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(buffer).view(getattr(torch, dtype))


def _elements(buffer: np.ndarray | torch.Tensor, dtype: str) -> int:
    """How many ``dtype`` elements the buffer holds."""
    if isinstance(buffer, torch.Tensor):
        return buffer.numel() // getattr(torch, dtype).itemsize
    return len(buffer)


def _check_buffer(dtype: str, buffer: object) -> None:
    carrier = _carrier(dtype)
    if isinstance(buffer, torch.Tensor):
        width = getattr(torch, dtype).itemsize
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() % width:
            raise ValueError(
                f"flat weights: the {dtype} buffer must be a 1-D uint8 tensor of whole {width}-byte "
                f"elements, got {buffer.dtype} with shape {tuple(buffer.shape)}"
            )
        if not buffer.is_contiguous():
            raise ValueError(f"flat weights: the {dtype} buffer is not contiguous")
        return
    if not isinstance(buffer, np.ndarray) or buffer.ndim != 1 or buffer.dtype != carrier:
        got = f"{buffer.dtype} with shape {buffer.shape}" if isinstance(buffer, np.ndarray) else type(buffer)
        raise ValueError(f"flat weights: the {dtype} buffer must be a 1-D {carrier} array, got {got}")
    if not buffer.flags.c_contiguous:
        raise ValueError(f"flat weights: the {dtype} buffer is not contiguous")


def _check_entry(entry: TensorEntry, buffers: Mapping[str, np.ndarray | torch.Tensor]) -> None:
    if entry.dtype not in buffers:
        raise ValueError(
            f"flat weights: tensor {entry.name!r} has dtype {entry.dtype} but there is no such buffer"
        )
    if any(not isinstance(n, int) or n < 0 for n in entry.shape) or entry.offset < 0:
        raise ValueError(
            f"flat weights: tensor {entry.name!r} has bad shape {entry.shape} or offset {entry.offset}"
        )
    size = _elements(buffers[entry.dtype], entry.dtype)
    if entry.end > size:
        raise ValueError(
            f"flat weights: tensor {entry.name!r} spans [{entry.offset}, {entry.end}) beyond the "
            f"{entry.dtype} buffer of {size} elements"
        )


def _check_tiling(dtype: str, size: int, entries: list[TensorEntry]) -> None:
    """The distinct spans of ``entries`` must cover ``[0, size)`` exactly, each starting where the last ended."""
    spans = sorted({(entry.offset, entry.end): entry.name for entry in entries}.items())
    position = 0
    for (offset, end), name in spans:
        if offset != position:
            what = "overlaps the tensor before it" if offset < position else f"leaves a gap at {position}"
            raise ValueError(f"flat weights: tensor {name!r} at offset {offset} {what} in the {dtype} buffer")
        position = end
    if position != size:
        raise ValueError(
            f"flat weights: the {dtype} buffer has {size} elements but its tensors cover {position}"
        )


def layout_of(
    items: list[tuple[str, torch.Tensor]],
) -> tuple[list[TensorEntry], dict[str, int], list[bool]]:
    """``pack_state``'s layout, for packers that put the buffers elsewhere (``weight_sync.broadcast``'s device
    buckets): each tensor's entry, each dtype's buffer size in elements, and whether the tensor fills its span."""
    return _layout(items)


def carrier_of(dtype: str) -> np.dtype:
    """The numpy word type that carries ``dtype``'s bits (``ValueError`` for a dtype that cannot travel)."""
    return _carrier(dtype)
