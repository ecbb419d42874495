"""Run a function on N local ranks joined in one process group (gloo, or NCCL on GPUs), and collect results.

Tests and benchmarks of the sharded trainer use this instead of Ray: it is the same process group the rank
actors join (``trainer.distributed.process_group``), without a Ray cluster's start-up cost.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from asyncrl.trainer.distributed.process_group import free_port, join_process_group, leave_process_group

PRELOADED = ("torch", "asyncrl.trainer.trainer")
"""Imported once by the fork server every rank is forked from: a rank then starts in milliseconds instead of
importing torch and the trainer again (seconds of CPU per rank, most of a small sharded test). The server
forks before any torch thread pool exists, so ranks do not inherit one (unlike a fork of the caller)."""


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    num_threads: int = 1,
    timeout_s: float = 600.0,
    device: str = "cpu",
) -> list[Any]:
    """``[fn(*args) on rank 0, ..., on rank world_size - 1]``, each rank a new process in one group: gloo
    on ``cpu``, NCCL on ``cuda`` (rank r on GPU r).

    ``fn`` must be importable (module level) and return something picklable; an exception on any rank is
    raised here with that rank's traceback.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))  # takes effect when the first call starts the server
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, num_threads, device, args, results),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        collected = _collect(results, processes, timeout_s)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    failures = [value for value in collected.values() if isinstance(value, _RankFailure)]
    if failures:
        raise RuntimeError("\n".join(f"rank {f.rank} failed:\n{f.trace}" for f in failures))
    return [collected[rank] for rank in range(world_size)]


def _collect(results: Any, processes: list[Any], timeout_s: float) -> dict[int, Any]:
    """Every rank's result; a rank that dies without one (a crash in C++, a kill) fails the run at once."""
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(collected) < len(processes):
        try:
            rank, payload = results.get(timeout=1.0)
            collected[rank] = pickle.loads(payload)
        except queue.Empty:
            dead = [r for r, p in enumerate(processes) if r not in collected and p.exitcode not in (None, 0)]
            if dead:
                codes = {r: processes[r].exitcode for r in dead}
                raise RuntimeError(f"rank(s) {dead} died without a result (exit codes {codes})") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks gave no result within {timeout_s} s") from None
    return collected


class _RankFailure:
    def __init__(self, rank: int, trace: str) -> None:
        self.rank, self.trace = rank, trace


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    num_threads: int,
    device: str,
    args: tuple[Any, ...],
    results: Any,
) -> None:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(num_threads)
    try:
        rank_device = "cpu" if device == "cpu" else f"cuda:{rank}"
        join_process_group(device=rank_device, host="127.0.0.1", port=port, rank=rank, world_size=world_size)
        value: Any = fn(*args)
    except BaseException:  # reported to the parent, which raises it
        value = _RankFailure(rank, traceback.format_exc())
    finally:
        leave_process_group()
    # By value: torch's queue reducers would share tensor memory that dies with this process.
    results.put((rank, pickle.dumps(value)))
