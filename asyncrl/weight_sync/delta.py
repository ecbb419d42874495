"""Delta updates over shared storage: per version, only what changed since the previous one, on disk.

For runs whose trainer and engines meet only through a shared directory or a slow link. At RL learning rates
most bfloat16 weights do not change from one step to the next, so a version's changes are a few per cent of
the model; in float32 nearly every weight changes in its low mantissa bits, which XOR-and-compress shrinks.

::

    trainer (publish v)                                   root/
      pack v ─► XOR against v-1 (kept packed in memory) ─► delta-v/  index.json + data.bin  (always, after v-1)
             └► every ``full_every`` versions, or first ─► full-v/   the words as they are (raw, memory-mapped)
      GC: every version older than the ``keep_full``-th newest full snapshot is deleted
    engine (serving u, asked for v)
      fetch (before it pauses): plan = delta-(u+1) … delta-v, or, when that chain is broken, the newest
             full-s ≤ v then delta-(s+1) … delta-v; read the deltas into memory (snapshots stay mapped)
      apply (paused): patch each tensor in place, chunk by chunk, and check its CRC-32 against the trainer's;
             a bad checksum or a file gone since the fetch falls back to the snapshot plan once

Per tensor (a *segment*: one span of the packed buffers; tied names share one) the delta is the cheapest of
``same`` (unchanged, nothing stored), ``sparse`` (zlib of the changed positions' gaps and new words) and ``xor``
(zlib of the XOR words, byte-shuffled so their all-zero high bytes compress together). Every segment carries
the CRC-32 of its *new* words, so an engine never serves bytes the trainer did not have.

Key decisions:
- The engine patches its own weights in place (``apply_into``): no second copy of the model on the engine
  side, nor of a tensor (each payload is inflated and applied a chunk at a time, ``_decode_into``); beside
  its weights it holds the fetched deltas and a few chunks. The trainer side keeps one packed copy of the
  previous version to diff against, and a publish holds beside it only the new packed copy and one tensor's
  compressed payload (``encode_delta``). An engine that cannot patch in place (vLLM, fed through its weight
  loader) reads ``receive``: each tensor rebuilt alone from the newest snapshot and its chain, one at a time.
- A version directory is written under a temporary name and renamed, so readers never see half of one.
- The first version a writer publishes (a new run, or one resumed from a checkpoint) is a full snapshot, and
  every version above it is deleted first: those came from a run that died past its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from asyncrl.weight_sync.flat import FlatWeights, TensorEntry, pack_state
from asyncrl.weight_sync.protocol import (
    BucketedPublish,
    LoraAdapter,
    ManifestEntry,
    NamedTensors,
    WeightSyncError,
    WeightUpdate,
)

logger = logging.getLogger(__name__)

INDEX, DATA = "index.json", "data.bin"
SPARSE_MAX_SHARE = 0.5
"""Sparse is chosen when positions + new words take under this share of the raw tensor (else XOR)."""
Payload = bytes | bytearray | memoryview
"""A segment's stored bytes: a delta's compressed stream, or a full snapshot's view of the packed words."""
CHUNK_WORDS = 1 << 20
"""Words of a tensor an encoding pass holds temporaries for at once (4 MiB of float32; ``encode_delta``)."""


@dataclass(frozen=True, kw_only=True)
class DeltaHandle:
    """Where version ``version`` lives: the shared ``root`` directory (the ``WeightUpdate`` handle)."""

    root: str
    version: int


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One distinct span of packed weights as stored in a version directory."""

    names: tuple[str, ...]
    dtype: str
    shape: tuple[int, ...]
    encoding: str
    """``same`` | ``sparse`` | ``xor`` (a delta) or ``raw`` (a full snapshot)."""
    start: int
    length: int
    """Byte range of its payload in ``data.bin``."""
    crc32: int
    """CRC-32 of the segment's new words: what the engine must hold after applying it."""


class DeltaChecksumError(WeightSyncError):
    """A patched tensor does not match the trainer's checksum (corrupt or mismatched base)."""


class DeltaPayloadError(DeltaChecksumError):
    """A segment's payload is cut short, corrupt, or not the size its tensor needs (caught and fallen back
    from like a bad checksum: the tensor may already be partly patched)."""


# ---------------------------------------------------------------------------------------------- trainer side


class DeltaWriter:
    """Writes each published version into ``root`` (see the module docstring) and collects old ones."""

    def __init__(self, root: str | os.PathLike[str], *, full_every: int = 20, keep_full: int = 2) -> None:
        if full_every < 1 or keep_full < 1:
            raise ValueError(f"full_every and keep_full must be >= 1, got {full_every}, {keep_full}")
        self.root = Path(root)
        self.full_every = full_every
        self.keep_full = keep_full
        self._previous: list[FlatWeights] | None = None
        self._previous_version: int | None = None
        self.last_written: dict[str, int] = {}
        """Bytes written for the last version: ``delta`` and ``full`` (0 when not written)."""

    def write(self, version: int, buckets: Iterable[NamedTensors]) -> WeightUpdate:
        """Pack ``buckets`` (gathered lazily, one at a time), write version ``version``; its ``WeightUpdate``."""
        flats = [pack_state(bucket, version) for bucket in buckets]
        if not flats:
            raise WeightSyncError(f"weight update v{version}: no tensors to publish")
        self.root.mkdir(parents=True, exist_ok=True)
        if self._previous_version is None:
            _remove_versions(self.root, lambda v: v >= version)  # a dead run's future: never a chain link
        with_delta = self._previous_version == version - 1 and _same_layout(self._previous, flats)
        with_full = not with_delta or version % self.full_every == 0
        written = {"delta": 0, "full": 0}
        if with_delta:
            written["delta"] = _write_version(
                self.root, "delta", version, _delta_segments(self._previous, flats)
            )
        if with_full:
            written["full"] = _write_version(self.root, "full", version, _full_segments(flats))
        self._previous, self._previous_version, self.last_written = flats, version, written
        self.collect_garbage()
        manifest = tuple(
            ManifestEntry(name=e.name, dtype=e.dtype, shape=e.shape) for flat in flats for e in flat.manifest
        )
        handle = DeltaHandle(root=str(self.root), version=version)
        return WeightUpdate(
            version=version,
            transport="delta",
            manifest=manifest,
            handle=handle,
            shipped_bytes=sum(written.values()),
        )

    def collect_garbage(self) -> None:
        """Delete every version older than the ``keep_full``-th newest full snapshot."""
        fulls = sorted(_versions(self.root, "full"), reverse=True)
        if len(fulls) >= self.keep_full:
            oldest_kept = fulls[self.keep_full - 1]
            _remove_versions(self.root, lambda v: v < oldest_kept)


def _same_layout(previous: list[FlatWeights] | None, flats: list[FlatWeights]) -> bool:
    """Whether ``flats`` pack the same tensors into the same spans as ``previous`` (so spans can be diffed)."""
    return previous is not None and [p.manifest for p in previous] == [f.manifest for f in flats]


def _spans(flat: FlatWeights) -> Iterator[tuple[tuple[str, ...], TensorEntry]]:
    """Each distinct span of ``flat`` once, with every name that views it (tied embeddings: two)."""
    by_span: dict[tuple[str, int], list[TensorEntry]] = {}
    for entry in flat.manifest:
        by_span.setdefault((entry.dtype, entry.offset), []).append(entry)
    for entries in by_span.values():
        yield tuple(e.name for e in entries), entries[0]


def _words(flat: FlatWeights, entry: TensorEntry) -> np.ndarray:
    return flat.buffers[entry.dtype][entry.offset : entry.end]


def _full_segments(
    flats: list[FlatWeights],
) -> Iterator[tuple[tuple[str, ...], TensorEntry, str, Payload, int]]:
    for flat in flats:
        for names, entry in _spans(flat):
            words = _words(flat, entry)
            yield names, entry, "raw", memoryview(words).cast("B"), zlib.crc32(words)


def _delta_segments(
    previous: list[FlatWeights], flats: list[FlatWeights]
) -> Iterator[tuple[tuple[str, ...], TensorEntry, str, Payload, int]]:
    for old, new in zip(previous, flats, strict=True):
        for names, entry in _spans(new):
            words = _words(new, entry)  # no name keeps a payload alive in here while the next is encoded
            yield names, entry, *encode_delta(_words(old, entry), words), zlib.crc32(words)


def encode_delta(old: np.ndarray, new: np.ndarray) -> tuple[str, Payload]:
    """(encoding, payload) turning ``old`` words into ``new`` (module docstring: same, sparse or xor).

    Why chunk by chunk (``CHUNK_WORDS``): whole-tensor temporaries (the XOR, its changed positions as int64,
    its byte-shuffled copy) would be held together, 4.5x the largest tensor (2 GiB at Qwen2-0.5B in float32)
    on top of the new packed copy. Each pass recomputes a chunk's XOR instead (cheap beside zlib) and feeds
    one zlib stream, so the payload is the only thing held that grows with the tensor.
    """
    spans = [(start, min(start + CHUNK_WORDS, new.size)) for start in range(0, new.size, CHUNK_WORDS)]
    num_changed = sum(int(np.count_nonzero(old[a:b] != new[a:b])) for a, b in spans)
    if num_changed == 0:
        return "same", bytearray()
    width = new.dtype.itemsize
    stream = _Compressed()
    if num_changed * (4 + width) < SPARSE_MAX_SHARE * new.size * width:
        last = 0  # gaps between changed positions (the first from 0), then the changed positions' new words
        for a, b in spans:
            changed = np.flatnonzero(old[a:b] != new[a:b]) + a
            if changed.size:
                stream.add(np.diff(changed, prepend=last).astype(np.uint32))
                last = changed[-1]
        for a, b in spans:
            stream.add(new[a:b][old[a:b] != new[a:b]])
        return "sparse", stream.finish()
    for byte in range(width):  # byte plane by byte plane: every word's byte 0, then every word's byte 1, ...
        for a, b in spans:
            xor = np.bitwise_xor(old[a:b], new[a:b])
            stream.add(np.ascontiguousarray(xor.view(np.uint8).reshape(-1, width)[:, byte]))
    return "xor", stream.finish()


class _Compressed:
    """One zlib stream (level 1) fed piece by piece into a growing ``bytearray``: ``zlib.decompress`` reads
    it as it read ``zlib.compress`` of the pieces joined, without the pieces ever being joined."""

    def __init__(self) -> None:
        self._compressor = zlib.compressobj(1)
        self._out = bytearray()

    def add(self, words: np.ndarray) -> None:
        self._out += self._compressor.compress(words)

    def finish(self) -> bytearray:
        self._out += self._compressor.flush()
        return self._out


def _write_version(root: Path, kind: str, version: int, segments: Iterable[tuple]) -> int:
    """Write ``kind-v`` atomically (a temporary directory renamed); the bytes of its payloads."""
    final = root / f"{kind}-{version:08d}"
    staging = root / f".tmp-{kind}-{version:08d}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    index, offset = [], 0
    with (staging / DATA).open("wb") as data:
        for names, entry, encoding, payload, crc in segments:
            data.write(payload)
            length = memoryview(payload).nbytes
            del payload  # written: let it go before the next segment is encoded
            index.append(
                {
                    "names": list(names),
                    "dtype": entry.dtype,
                    "shape": list(entry.shape),
                    "encoding": encoding,
                    "start": offset,
                    "length": length,
                    "crc32": crc,
                }
            )
            offset += length
    header = {"version": version, "kind": kind, "base": version - 1 if kind == "delta" else None}
    (staging / INDEX).write_text(json.dumps({**header, "segments": index}))
    shutil.rmtree(final, ignore_errors=True)
    os.rename(staging, final)
    return offset


def _versions(root: Path, kind: str) -> list[int]:
    if not root.is_dir():
        return []
    return [int(p.name.split("-")[1]) for p in root.iterdir() if p.name.startswith(f"{kind}-")]


def _remove_versions(root: Path, doomed: Any) -> None:
    for path in list(root.iterdir()) if root.is_dir() else []:
        kind, _, number = path.name.partition("-")
        if kind in ("delta", "full") and number.isdigit() and doomed(int(number)):
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- engine side


@dataclass(frozen=True, kw_only=True)
class FetchedVersion:
    """One version directory read for applying: its segments and their payloads (deltas in memory, a full
    snapshot memory-mapped)."""

    kind: str
    version: int
    segments: tuple[Segment, ...]
    data: Any
    """bytes (a delta) or a read-only ``np.memmap`` of uint8 (a full snapshot)."""


@dataclass(frozen=True, kw_only=True)
class FetchedChain:
    """What turns an engine serving ``from_version`` into ``to_version``, in the order to apply."""

    from_version: int | None
    to_version: int
    steps: tuple[FetchedVersion, ...]

    @property
    def uses_full(self) -> bool:
        return bool(self.steps) and self.steps[0].kind == "full"


def fetch_chain(handle: DeltaHandle, from_version: int | None) -> FetchedChain:
    """Read what turns weights at ``from_version`` into ``handle.version``: the delta chain when every link is
    there, else the newest full snapshot at or below the target and the deltas after it (``from_version``
    None asks for that fallback). ``WeightSyncError`` when neither exists."""
    root, target = Path(handle.root), handle.version
    plan = _delta_plan(root, from_version, target) if from_version is not None else None
    if plan is None:
        plan = _full_plan(root, target)
    try:
        steps = tuple(_read_version(root, kind, version) for kind, version in plan)
    except FileNotFoundError as error:  # collected between planning and reading: the snapshot plan, once
        if from_version is None:
            raise WeightSyncError(
                f"weight update v{target}: {error}; nothing left to fall back to"
            ) from error
        return fetch_chain(handle, None)
    return FetchedChain(from_version=from_version, to_version=target, steps=steps)


def _delta_plan(root: Path, from_version: int, target: int) -> list[tuple[str, int]] | None:
    links = [("delta", v) for v in range(from_version + 1, target + 1)]
    return links if all((root / f"delta-{v:08d}" / INDEX).is_file() for _, v in links) else None


def _full_plan(root: Path, target: int) -> list[tuple[str, int]]:
    for full in sorted((v for v in _versions(root, "full") if v <= target), reverse=True):
        plan = _delta_plan(root, full, target)
        if plan is not None:
            return [("full", full), *plan]
    raise WeightSyncError(
        f"weight update v{target}: no delta chain and no full snapshot with a chain to it under {root}"
    )


def _read_version(root: Path, kind: str, version: int) -> FetchedVersion:
    directory = root / f"{kind}-{version:08d}"
    index = json.loads((directory / INDEX).read_text())
    segments = tuple(
        Segment(
            names=tuple(s["names"]),
            dtype=s["dtype"],
            shape=tuple(s["shape"]),
            encoding=s["encoding"],
            start=s["start"],
            length=s["length"],
            crc32=s["crc32"],
        )
        for s in index["segments"]
    )
    path = directory / DATA
    if kind == "full":
        data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else b""
    else:
        data = path.read_bytes()
    return FetchedVersion(kind=kind, version=version, segments=segments, data=data)


def apply_chain(chain: FetchedChain, params: Mapping[str, torch.Tensor]) -> None:
    """Patch ``params`` (the engine's tensors by name, tied names included) along ``chain``, checking every
    segment's CRC-32; ``DeltaChecksumError`` at the first mismatch (tensors before it are already patched)."""
    for step in chain.steps:
        for segment in step.segments:
            _apply_segment(step, segment, params)


def rebuilt_tensors(chain: FetchedChain) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of ``chain`` (a full snapshot first, then its deltas: ``fetch_chain(handle, None)``) as
    fresh host memory, built from its snapshot segment and patched by each delta's segment for it (checksums
    checked), handed out under every name it has (tied names: one tensor) before the next is built.

    Why one tensor at a time: an engine that cannot patch its own weights in place (vLLM, fed through its
    weight loader) reads an update through ``receive``; rebuilding every tensor first held a whole model in
    host memory beside the engine's own, where a consumer that drops each tensor (a bucket stream) holds one.
    The layout is checked before the generator is returned: every delta must carry exactly the snapshot's
    tensors (``WeightSyncError`` naming the first that differs)."""
    snapshot, deltas = chain.steps[0], chain.steps[1:]
    names = {segment.names[0] for segment in snapshot.segments}
    patches = []
    for step in deltas:
        by_name = {segment.names[0]: segment for segment in step.segments}
        stray = sorted(names ^ by_name.keys())
        if stray:
            raise WeightSyncError(
                f"weight update v{step.version}: tensor {stray[0]!r} is in only one of the delta and the "
                f"full snapshot v{snapshot.version} it applies to"
            )
        patches.append((step, by_name))
    return _rebuild(snapshot, patches)


def _rebuild(
    snapshot: FetchedVersion, patches: list[tuple[FetchedVersion, dict[str, Segment]]]
) -> Iterator[tuple[str, torch.Tensor]]:
    for segment in snapshot.segments:
        tensor = torch.empty(segment.shape, dtype=getattr(torch, segment.dtype))
        target = {segment.names[0]: tensor}
        _apply_segment(snapshot, segment, target)
        for step, by_name in patches:
            _apply_segment(step, by_name[segment.names[0]], target)
        for name in segment.names:
            yield name, tensor
        del tensor, target  # not held while the next tensor is built


def _apply_segment(step: FetchedVersion, segment: Segment, params: Mapping[str, torch.Tensor]) -> None:
    name = segment.names[0]
    target = params.get(name)
    if target is None:
        raise WeightSyncError(f"weight update v{step.version}: the engine has no tensor {name!r}")
    if str(target.dtype).removeprefix("torch.") != segment.dtype or tuple(target.shape) != segment.shape:
        raise WeightSyncError(
            f"weight update v{step.version}: {name!r} is {segment.dtype} {segment.shape} in the update, "
            f"{target.dtype} {tuple(target.shape)} on the engine; delta updates need the same dtype on both sides "
            "(the trainer publishes in engine.dtype as its own device resolves it: set engine.dtype)"
        )
    if not target.is_contiguous():
        raise WeightSyncError(f"weight update v{step.version}: {name!r} is not contiguous on the engine")
    flat = target.detach().view(-1).view(_word_dtype(target.dtype))
    words = _HostWords(flat.numpy()) if flat.device.type == "cpu" else _DeviceWords(flat)
    payload = memoryview(step.data)[segment.start : segment.start + segment.length]  # a view, not a copy
    try:
        _decode_into(segment.encoding, payload, words)
    except DeltaPayloadError as error:
        raise DeltaPayloadError(f"weight update v{step.version}: tensor {name!r}: {error}") from error
    if words.crc32() != segment.crc32:
        raise DeltaChecksumError(f"weight update v{step.version}: tensor {name!r} fails its checksum")


def _decode_into(encoding: str, payload: Payload, words: _Words) -> None:
    """Apply one segment's payload to ``words`` (the engine's tensor as unsigned words) in place.

    Why chunk by chunk (``CHUNK_WORDS``): decoding a whole tensor's payload first held its decompressed
    stream and an un-shuffled copy (XOR) or its positions as int64 (sparse) beside the tensor, 3x or 2x
    the largest tensor (7.5 or 5 GB at an 8B model's 2.5 GB float32 embedding). Each chunk is inflated and
    applied in place instead, so a corrupt or cut payload is found part-way through an XOR delta, after
    earlier chunks landed: the tensor is then wrong, like one failing its checksum, and the caller falls
    back the same way.
    """
    if encoding == "same":
        return
    if encoding == "raw":
        _copy_raw(np.frombuffer(payload, dtype=np.uint8), words)
    elif encoding == "xor":
        _apply_xor(_Inflater(payload), words)
    elif encoding == "sparse":
        _apply_sparse(payload, words)
    else:
        raise WeightSyncError(f"unknown delta encoding {encoding!r}")


def _chunks(size: int) -> Iterator[tuple[int, int]]:
    return ((a, min(a + CHUNK_WORDS, size)) for a in range(0, size, CHUNK_WORDS))


def _copy_raw(data: np.ndarray, words: _Words) -> None:
    width = words.dtype.itemsize
    if data.size != words.size * width:
        raise DeltaPayloadError(f"its snapshot has {data.size} bytes, the tensor {words.size * width}")
    for a, b in _chunks(words.size):
        words.assign(a, data[a * width : b * width].view(words.dtype))


def _apply_xor(stream: _Inflater, words: _Words) -> None:
    """The stream is the XOR words byte plane by byte plane (every word's byte 0, then byte 1, ...)."""
    for plane in range(words.dtype.itemsize):
        for a, b in _chunks(words.size):
            words.xor_plane(a, b, plane, np.frombuffer(stream.read(b - a), dtype=np.uint8))
    stream.finish()


def _apply_sparse(payload: Payload, words: _Words) -> None:
    """The stream is every changed position's gap (uint32, the first from 0), then every new word. Its length
    gives the count, so a first pass inflates it to the end, checking it whole before any word is written;
    then two readers walk it in step, one over the gaps and one over the words."""
    width = words.dtype.itemsize
    total = _Inflater(payload).skip_to_end()
    if total % (4 + width):
        raise DeltaPayloadError(
            f"its sparse stream has {total} bytes, not a whole number of {4 + width}-byte entries"
        )
    count = total // (4 + width)
    gaps, new_words = _Inflater(payload), _Inflater(payload)
    new_words.skip(4 * count)
    last = 0
    for a, b in _chunks(count):
        positions = np.cumsum(np.frombuffer(gaps.read(4 * (b - a)), dtype=np.uint32), dtype=np.int64)
        positions += last
        last = int(positions[-1])
        if last >= words.size:
            raise DeltaPayloadError(f"it changes word {last} of a tensor of {words.size}")
        words.put(positions, np.frombuffer(new_words.read(width * (b - a)), dtype=words.dtype))
    new_words.finish()


class _Inflater:
    """One segment's zlib stream, inflated in pieces of at most ``4 * CHUNK_WORDS`` bytes: neither its output
    nor its input is ever held whole (the input is fed in views of that size, so zlib's ``unconsumed_tail``,
    a copy of what a call did not consume, stays that small). A stream that ends early, does not end, runs
    past what its tensor needs or is corrupt raises ``DeltaPayloadError``."""

    def __init__(self, payload: Payload) -> None:
        self._payload = memoryview(payload).cast("B")
        self._fed = 0
        self._tail = b""
        self._inflate = zlib.decompressobj()
        self.produced = 0
        """Bytes of output handed out so far."""

    def read(self, size: int) -> bytes:
        """Exactly the next ``size`` bytes of output."""
        pieces, got = [], 0
        while got < size:
            piece = self._pull(size - got)
            if not piece:
                raise DeltaPayloadError(
                    f"its payload is cut short: {self.produced + got} bytes decoded, at least "
                    f"{self.produced + size} needed"
                )
            pieces.append(piece)
            got += len(piece)
        self.produced += size
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def skip(self, size: int) -> None:
        """Inflate and drop the next ``size`` bytes of output, a chunk at a time."""
        while size:
            step = min(size, 4 * CHUNK_WORDS)
            self.read(step)
            size -= step

    def skip_to_end(self) -> int:
        """Inflate the rest of the stream and drop it; the total bytes it decodes to."""
        while piece := self._pull(4 * CHUNK_WORDS):
            self.produced += len(piece)
        self._check_ended()
        return self.produced

    def finish(self) -> None:
        """Check that the stream ends here, with nothing after it."""
        if self._pull(1):
            raise DeltaPayloadError(
                f"its payload decodes to more than the {self.produced} bytes the tensor needs"
            )
        self._check_ended()

    def _check_ended(self) -> None:
        if not self._inflate.eof:
            raise DeltaPayloadError(
                f"its payload is cut short: its zlib stream stops after {self.produced} bytes"
            )
        if self._inflate.unused_data or self._fed < len(self._payload):
            raise DeltaPayloadError("its payload has bytes after the end of its zlib stream")

    def _pull(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of output; empty only at the stream's end or when the input runs out."""
        while not self._inflate.eof:
            if self._tail:
                data: Payload = self._tail
            else:
                data = self._payload[self._fed : self._fed + 4 * CHUNK_WORDS]
                self._fed += len(data)
            try:
                piece = self._inflate.decompress(data, limit)
            except zlib.error as error:
                raise DeltaPayloadError(f"its payload is corrupt: {error}") from error
            self._tail = self._inflate.unconsumed_tail
            if piece or not data:
                return piece
        return b""


class _Words(Protocol):
    """An engine tensor's words, edited in place a chunk at a time (``_decode_into``)."""

    size: int
    dtype: np.dtype

    def assign(self, start: int, values: np.ndarray) -> None: ...
    def xor_plane(self, start: int, end: int, plane: int, values: np.ndarray) -> None: ...
    def put(self, positions: np.ndarray, values: np.ndarray) -> None: ...
    def crc32(self) -> int: ...


class _HostWords:
    """A CPU tensor's words as a numpy view of its storage: every edit lands in the engine's weights."""

    def __init__(self, words: np.ndarray) -> None:
        self.words, self.size, self.dtype = words, words.size, words.dtype

    def assign(self, start: int, values: np.ndarray) -> None:
        self.words[start : start + values.size] = values

    def xor_plane(self, start: int, end: int, plane: int, values: np.ndarray) -> None:
        self.words[start:end].view(np.uint8).reshape(-1, self.dtype.itemsize)[:, plane] ^= values

    def put(self, positions: np.ndarray, values: np.ndarray) -> None:
        self.words[positions] = values

    def crc32(self) -> int:
        return zlib.crc32(self.words)


class _DeviceWords:
    """A tensor's words on any device (an accelerator's, where ``_HostWords`` cannot view them): each chunk
    is copied over and applied there, and the checksum reads the words back a chunk at a time, so the host
    never holds a copy of the tensor. Never run on CUDA here (no GPU); its tests run it on CPU tensors."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat, self.size = flat, flat.numel()
        self.dtype = np.dtype(f"{'u' if flat.element_size() == 1 else 'i'}{flat.element_size()}")

    def _to_device(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(values)).to(self.flat.device)  # a writable chunk torch may wrap

    def assign(self, start: int, values: np.ndarray) -> None:
        self.flat[start : start + values.size].copy_(self._to_device(values))

    def xor_plane(self, start: int, end: int, plane: int, values: np.ndarray) -> None:
        planes = self.flat[start:end].view(torch.uint8).view(-1, self.dtype.itemsize)
        planes[:, plane].bitwise_xor_(self._to_device(values))

    def put(self, positions: np.ndarray, values: np.ndarray) -> None:
        self.flat[self._to_device(positions)] = self._to_device(values)

    def crc32(self) -> int:
        crc = 0
        for a, b in _chunks(self.size):
            crc = zlib.crc32(self.flat[a:b].cpu().numpy(), crc)
        return crc


def _word_dtype(dtype: torch.dtype) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]


# ---------------------------------------------------------------------------------------------- transport


class DeltaSync(BucketedPublish):
    """``weight_sync.type=delta``: the ``WeightSync`` over a shared directory (module docstring).

    The trainer side needs ``root``; an engine side needs nothing (the update's handle names the directory).
    Engines that can patch their weights call ``prefetch`` then ``apply_into``; ``receive`` serves the others
    (it rebuilds each tensor from the newest snapshot and its chain, one at a time: ``rebuilt_tensors``).
    """

    name = "delta"

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, full_every: int = 20, keep_full: int = 2
    ) -> None:
        self.writer = DeltaWriter(root, full_every=full_every, keep_full=keep_full) if root else None

    def publish_buckets(
        self, version: int, buckets: Iterable[NamedTensors], *, adapter: LoraAdapter | None = None
    ) -> WeightUpdate:
        if adapter is not None:  # a delta is relative to the previous full weights; an adapter is not
            raise WeightSyncError(
                f"weight update v{version}: the delta transport carries full updates only; adapter-only "
                "(LoRA) updates travel by object_store, broadcast or in_process"
            )
        if self.writer is None:
            raise WeightSyncError("the delta transport publishes only with a root directory")
        return self.writer.write(version, buckets)

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, Any]]:
        """The update's tensors, each rebuilt alone from the newest full snapshot and the deltas after it
        (``rebuilt_tensors``). The chain is fetched and its layout checked now; a tensor failing its checksum
        raises when the iteration reaches it."""
        return rebuilt_tensors(fetch_chain(_handle(update), None))

    def fetch(self, update: WeightUpdate, serving_version: int) -> FetchedChain:
        """Read (before the engine pauses) what brings an engine at ``serving_version`` to the update."""
        return fetch_chain(_handle(update), serving_version)

    def apply_into(
        self,
        update: WeightUpdate,
        params: Mapping[str, torch.Tensor],
        serving_version: int,
        fetched: FetchedChain | None = None,
    ) -> FetchedChain:
        """Patch ``params`` to ``update``'s version (``fetched`` if it still starts at ``serving_version``,
        else fetched now); on a bad checksum or a broken chain, once more from the newest full snapshot.
        Returns the chain applied (its ``uses_full`` tells whether it fell back)."""
        handle = _handle(update)
        if fetched is None or fetched.from_version != serving_version or fetched.to_version != update.version:
            fetched = fetch_chain(handle, serving_version)
        try:
            apply_chain(fetched, params)
            return fetched
        except DeltaChecksumError as error:
            if fetched.uses_full:
                raise
            logger.warning("%s; falling back to the newest full snapshot", error)
        fetched = fetch_chain(handle, None)
        apply_chain(fetched, params)
        return fetched


def _handle(update: WeightUpdate) -> DeltaHandle:
    if update.transport != DeltaSync.name or not isinstance(update.handle, DeltaHandle):
        raise WeightSyncError(f"weight update v{update.version} travels by {update.transport!r}, not 'delta'")
    return update.handle
