"""A weight update into the vLLM worker, streamed bucket by bucket through shared-memory files.

Key decision: no tensor byte crosses the worker's socket or vLLM's ``collective_rpc`` (whose msgpack refuses
a bytes object over 4 GiB): each bucket is written into a file in ``/dev/shm`` (the same host: the worker is
this process's child) and only its path and layout travel. vLLM's own worker maps the file and hands views of
it to the model's weight loader, so the engine side holds no copy beyond the mapping. At most ``IN_FLIGHT`` buckets
exist at once: bucket k+1 is written while bucket k loads, and bucket k+2 waits for bucket k's answer. Beside
them this side holds the group of tensors it is collecting for the next file: for a transport that makes each
tensor as it is read (delta's ``receive`` rebuilds them), one bucket's worth and the tensor that overflowed it.

Wire contract with ``worker_main`` (``op_update_begin`` / ``op_update_bucket`` / ``op_update_commit``): begin
carries the manifest ``[[name, dtype, shape], ...]``; each bucket carries ``path``, ``nbytes`` and entries
``[[name, dtype, shape, byte_offset], ...]``; commit carries the version. The worker refuses (naming the
tensor) an entry outside the manifest, a tensor sent more often than the manifest lists it, and a commit
before every manifest entry arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from asyncrl.engine.vllm.shm_room import check_room, reserve, shm_dir
from asyncrl.weight_sync.buckets import aligned, group_into_buckets, layout, pack_into
from asyncrl.weight_sync.protocol import ManifestEntry

DEFAULT_BUCKET_BYTES = 256 * 2**20
"""The bucket size of ``weight_sync.bucket_mb``'s default."""
IN_FLIGHT = 2
"""Buckets that exist at once: one loading in the engine, the next being written."""

Call = Callable[..., Awaitable[Any]]
"""The client's ``_call(op, timeout_s, **fields)``."""


def write_bucket(directory: str, named: list[tuple[str, torch.Tensor]]) -> tuple[str, int, list[list[Any]]]:
    """Pack ``named`` into a new file under ``directory`` (a unique name, owner-only); its path, size in bytes
    and entries as builtins. Its memory is reserved before it is written (``shm_room.reserve``): a full
    ``/dev/shm`` is ``SharedMemoryFull``, and the file is removed."""
    _, nbytes = layout(named)
    path = os.path.join(directory, f"asyncrl-weights-{os.getpid()}-{secrets.token_hex(8)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        if nbytes == 0:  # only empty tensors: nothing to map
            return path, 0, [entry.as_list() for entry in layout(named)[0]]
        reserve(fd, path, nbytes)
        with mmap.mmap(fd, nbytes) as mapped:
            buffer = torch.frombuffer(mapped, dtype=torch.uint8)
            entries = pack_into(buffer, named)
            del buffer  # the mapping closes only once no tensor exports it
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path, nbytes, [entry.as_list() for entry in entries]


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # never written (the write failed) or already removed
        os.unlink(path)


async def stream_update(
    call: Call,
    manifest: Sequence[ManifestEntry],
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    version: int,
    bucket_bytes: int,
    timeout_s: float,
    directory: str | None = None,
) -> int:
    """Send ``named_tensors`` (listed by ``manifest``, already checked against the model) as update
    ``version``; the version the worker serves afterwards. Packing and reading the tensors (which may fetch
    lazily, e.g. object-store buckets) run in a thread, off the caller's event loop."""
    directory = directory or shm_dir()
    check_room(directory, held_at_once(manifest, bucket_bytes), f"weight update v{version}'s bucket files")
    await call(
        "update_begin",
        timeout_s,
        version=version,
        manifest=[[e.name, e.dtype, list(e.shape)] for e in manifest],
    )
    groups = group_into_buckets(named_tensors, bucket_bytes)
    in_flight: deque[tuple[asyncio.Future, str]] = deque()
    collected: list[list[tuple[str, torch.Tensor]]] = []  # the group read and not yet written: one at most
    try:
        while await asyncio.to_thread(_collect, groups, collected):
            if len(in_flight) == IN_FLIGHT:
                await _settle(in_flight.popleft())
            path, nbytes, entries = await asyncio.to_thread(_write_collected, directory, collected)
            fields = {"path": path, "nbytes": nbytes, "entries": entries}
            in_flight.append((asyncio.ensure_future(call("update_bucket", timeout_s, **fields)), path))
        while in_flight:
            await _settle(in_flight.popleft())
        return await call("update_commit", timeout_s, version=version)
    finally:
        for future, path in in_flight:  # a failed stream: stop waiting, and leave no file behind
            future.cancel()
            remove(path)


def held_at_once(manifest: Sequence[ManifestEntry], bucket_bytes: int) -> int:
    """The most bytes of bucket files an update of ``manifest`` holds at once: ``IN_FLIGHT`` buckets, each of at
    most ``bucket_bytes`` or one larger tensor alone, and never more than the whole update."""
    sizes = [aligned(entry.nbytes) for entry in manifest]  # as ``buckets.layout`` places them
    return min(IN_FLIGHT * max([bucket_bytes, *sizes]), sum(sizes))


def _collect(groups: Iterator[list[tuple[str, torch.Tensor]]], collected: list) -> bool:
    """Read the next group into ``collected``; False when none is left. The group never travels as a thread's
    result: a future's result and its finished work item are released by the executor's thread at a moment of
    its own, after the loop has moved on, so a group passed that way outlived its file at times (three groups
    alive beside the next one's first tensors, where two are promised)."""
    group = next(groups, None)
    if group is None:
        return False
    collected.append(group)
    return True


def _write_collected(directory: str, collected: list) -> tuple[str, int, list[list[Any]]]:
    """``write_bucket`` of the group ``_collect`` read, taken out of ``collected`` first, so that its last
    reference is this call's local, freed on this thread before the loop learns the file is written: tensors
    made as they are read (delta's) are gone before the next group's are made."""
    return write_bucket(directory, collected.pop())


async def _settle(sent: tuple[asyncio.Future, str]) -> None:
    """Wait for a bucket's answer, then remove its file (the engine's mapping, if any, outlives the name)."""
    future, path = sent
    try:
        await future
    finally:
        remove(path)
