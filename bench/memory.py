"""Peak extra memory of a process while something runs: its private pages sampled from ``/proc`` (Linux).

Why private pages (``Private_Clean + Private_Dirty`` of ``smaps_rollup``) and not RSS: a weight transport that
maps another process's shared memory touches every page of it, which RSS counts in full although no byte was
copied; the pages a process alone holds are what a copy costs it.
"""

from __future__ import annotations

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
