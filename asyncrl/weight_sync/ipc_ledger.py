"""Which colocated blocks an engine may still open, kept by the process that sends their handles (the driver on
Ray), so the trainer can let go of every block on every path, a block no engine ever opened included.

Why a ledger: torch keeps a CUDA block whose IPC handle it made (``reduce_tensor``) alive after its producer
drops it for as long as the block's shared reference counter is above 0. The counter starts at 1, and only a
process that opened the handle takes it back, when its mapping dies (and not if that process is killed). A block
whose engine was replaced first, or whose publication was superseded before its engine pulled it, would stay on
the trainer's GPU for the rest of the run (torch's "limbo"; ``torch.cuda.ipc_collect`` frees only blocks whose
counter is 0). The trainer cannot tell "never opened" from "opened and still read", so it takes the counter
back itself (``ColocatedSync.settle``) only once this ledger says no engine can read the block any more.

::

    published(key, rank) ─► sent(key, reader) ─► finished(key, reader)   (the call ended in the engine: its
          │                       │                                      mapping is gone, counter taken back)
          │                       └───────────► reader_gone(reader)      (replaced: its process is killed)
          └─► retired(key)   (the trainer let go: released, superseded or given back; its blocks parked)
    a key is settled (``take_settled``) once it is retired and no reader it was sent to can still read it;
    a send after that is refused by name (a released update is refused before, by its ``Lease``)

Rules (tests/unit/weight_sync/test_ipc_ledger.py, random schedules against a model of torch's counter):
- a key is settled only when retired and every send to it finished or its reader is gone, so no block is
  freed while a live engine may read it;
- a retired key with no live reader is settled at once, so no block outlives its last reader beyond the next
  call that reaches its trainer rank (``runtime.trainer_group``: every publish and release carries the settled
  keys);
- ``drain`` at shutdown settles every key, readers or not (the engines were ended first, ``RayParts.close``).

A send whose call timed out, was cancelled, or lost its actor (``ActorCallTimeout``, ``CancelledError``,
``ActorCallError``) stays outstanding until that engine is replaced: it may still be reading. With engine
recovery off it is never replaced, and its block is settled only at shutdown: kept, never freed under a reader.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from asyncrl.weight_sync.protocol import WeightSyncError


@dataclass
class _Entry:
    rank: int
    """The trainer rank holding the key's blocks (its engine's bundle)."""
    retired: bool = False
    readers: Counter[str] = field(default_factory=Counter)
    """Engines (by client name) the handle was sent to, and how many of their calls with it have not ended."""


class IpcLedger:
    """The colocated publications whose blocks a trainer rank still holds for engines, by key
    (``ColocatedHandle.key``), and the engines that may still read each (module docstring). Thread-safe: sends
    and replacements come from the event loop, publishes and releases from the controller's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._settled: dict[int, list[str]] = {}
        """Keys whose blocks can be let go for good, by trainer rank, until ``take_settled`` hands them out."""
        self._gone: set[str] = set()
        """Readers replaced (killed): a send to one of them can no longer be read."""

    def published(self, key: str, rank: int) -> None:
        """Trainer rank ``rank`` packed blocks under ``key``."""
        with self._lock:
            if key in self._entries:
                raise WeightSyncError(f"colocated publication {key}: published twice")
            self._entries[key] = _Entry(rank=rank)

    def sent(self, key: str, reader: str) -> None:
        """``key``'s handle is on its way to engine ``reader``, which may open it until ``finished`` or gone. A
        retired key not yet settled may still be sent (the proxy draining an update the next publish
        superseded): its blocks stay parked for it. A settled one is refused by name: they may be freed."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                raise WeightSyncError(
                    f"colocated publication {key}: sent to engine {reader}, but it is not held (settled "
                    "already: its blocks may be freed)"
                )
            if reader not in self._gone:
                entry.readers[reader] += 1

    def finished(self, key: str, reader: str) -> None:
        """Engine ``reader``'s call with ``key`` ended inside the engine (applied, or refused there): its mapping
        is gone and it took the counter back."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.readers[reader] > 0:
                entry.readers[reader] -= 1
                if entry.readers[reader] == 0:
                    del entry.readers[reader]
                self._settle_if_unread(key, entry)

    def reader_gone(self, reader: str) -> None:
        """Engine ``reader`` was replaced (its process killed): nothing it was sent can be read by it any more."""
        with self._lock:
            self._gone.add(reader)
            for key, entry in list(self._entries.items()):
                entry.readers.pop(reader, None)
                self._settle_if_unread(key, entry)

    def retired(self, keys: Iterable[str]) -> None:
        """The trainer lets go of ``keys``' blocks (released, superseded or given back): no new send."""
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    entry.retired = True
                    self._settle_if_unread(key, entry)

    def held(self) -> list[str]:
        """Every key not yet settled, retired ones included (what the trainer ranks still pin)."""
        with self._lock:
            return list(self._entries)

    def take_settled(self) -> dict[int, list[str]]:
        """The keys settled since the last call, by trainer rank: each rank forgets them for good."""
        with self._lock:
            settled, self._settled = self._settled, {}
            return settled

    def drain(self) -> dict[int, list[str]]:
        """Shutdown: every key, readers or not, by trainer rank (the engines were ended first)."""
        with self._lock:
            for key, entry in self._entries.items():
                self._settled.setdefault(entry.rank, []).append(key)
            self._entries.clear()
            settled, self._settled = self._settled, {}
            return settled

    def _settle_if_unread(self, key: str, entry: _Entry) -> None:
        if entry.retired and not entry.readers:
            del self._entries[key]
            self._settled.setdefault(entry.rank, []).append(key)
