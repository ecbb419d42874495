"""Pausing Python's cyclic garbage collector around a simulated run.

Key decision: a large simulated run keeps hundreds of thousands of container objects alive at once (requests,
trajectories and their dicts, futures, tasks), and the collector's full passes re-scan them all: a 4,096-
accelerator run takes 70 s with it and 42 s without (bench/simulator.py ``--gc on``), while it frees nothing
that reference counting would not free anyway. So, as ``timeit`` does, the collector is paused for the run and
runs once after it.
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
