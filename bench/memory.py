"""Peak extra memory of a process while something runs: its private pages sampled from ``/proc`` (Linux).

Why private pages (``Private_Clean + Private_Dirty`` of ``smaps_rollup``) and not RSS: a weight transport that
maps another process's shared memory touches every page of it, which RSS counts in full although no byte was
copied; the pages a process alone holds are what a copy costs it.

``TreePeak`` is the other measure: the peak resident set (``VmHWM``, shared pages included) of a whole process
tree, reset by the kernel rather than sampled, for a side whose mapped shared memory *is* its cost (a vLLM
engine mapping bucket files: those pages exist only while it maps them).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path


def private_bytes(pid: int | str = "self") -> int:
    """Private (unshared) resident bytes of process ``pid``; 0 where ``/proc`` has no ``smaps_rollup``."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


class PeakPrivateMemory:
    """``with PeakPrivateMemory(pid) as peak: ...`` then ``peak.extra``: the most private bytes above the
    level at entry seen while the block ran, sampled every ``interval_s`` on a thread, plus once at the end."""

    def __init__(self, pid: int | str = "self", interval_s: float = 0.002) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.extra = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakPrivateMemory:
        self._base = private_bytes(self.pid)
        self._peak = self._base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, private_bytes(self.pid))
        self.extra = max(0, self._peak - self._base)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, private_bytes(self.pid))
            time.sleep(self.interval_s)


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (vLLM's engine core is its worker's child)."""
    pids, index = [pid], 0
    while index < len(pids):
        for task in Path(f"/proc/{pids[index]}/task").glob("*"):
            with contextlib.suppress(OSError):  # a thread or process that ended meanwhile
                pids += [int(c) for c in (task / "children").read_text().split() if int(c) not in pids]
        index += 1
    return pids


def status_bytes(path: Path | str, field: str) -> int:
    """A ``field: N kB`` line of a /proc file (``/proc/<pid>/status``, ``/proc/meminfo``), in bytes."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(f"{path} has no {field!r} line")


def available_bytes() -> int:
    """The host's ``MemAvailable`` (free memory plus what the kernel can reclaim)."""
    return status_bytes("/proc/meminfo", "MemAvailable")


class TreePeak:
    """``with TreePeak(pid) as peak: ...`` then ``peak.before`` and ``peak.peak``: the resident bytes of ``pid``'s
    process tree (summed ``VmRSS``) at entry, and the sum of each process's peak (``VmHWM``) since entry. Each
    peak is reset at entry (Linux ``clear_refs`` 5, which needs write access to the process: one's own
    children); a sum of peaks is at least the tree's simultaneous peak, so it bounds it from above."""

    def __init__(self, pid: int) -> None:
        self.pids = process_tree(pid)
        self.before = 0
        self.peak = 0

    def __enter__(self) -> TreePeak:
        self.before = sum(status_bytes(f"/proc/{pid}/status", "VmRSS") for pid in self.pids)
        for pid in self.pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = sum(status_bytes(f"/proc/{pid}/status", "VmHWM") for pid in self.pids)

    @property
    def extra(self) -> int:
        return max(0, self.peak - self.before)
