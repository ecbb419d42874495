"""Pausing Python's cyclic garbage collector around a simulated run.

Key decision: a simulated run keeps thousands of trajectories alive, each holding token lists thousands long
and no reference cycle. Every automatic collection re-scans them all (about 35 % of the CPU at 4,096 simulated
accelerators) while freeing nothing reference counting would not free anyway; so, as ``timeit`` does, the
collector is paused for the run and runs once after it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused(paused: bool = True) -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (unless ``paused`` is False), collecting once after
    it; the collector's previous enabled state is restored."""
    enabled = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.collect()
