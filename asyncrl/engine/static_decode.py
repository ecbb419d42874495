"""Decode steps at bucketed static shapes, each bucket captured once as a CUDA graph on CUDA.

Why: a decode step of a small model is a few hundred tiny kernels; launched one by one from Python it costs
tens of milliseconds whatever the batch (the H200 probe measured 35–80 ms against 4–14 ms for the same model
in a captured static loop). A CUDA graph replays them all in one launch, but only at the shapes it was
captured with, so a step runs at its bucket's shape instead of its own:

- batch: the step's rows ``[0, num_rows)`` padded to the next batch bucket (1, 2, 3, 4, 6, 8, … up to the
  slot count); the padded rows are idle slots: token 0 at position 0, their KV write going to the scratch
  position;
- KV length, per row: the rows are split into attention groups by their own context's bucket (the next power
  of two, at least ``MIN_LENGTH_BUCKET``, half-octave steps above 2,048, at most the pool's length), each
  group's row count rounded up to the batch ladder (``decode_plan.static_shape``); a group attends over its
  level, the mask hiding every position past a row's own. A row pays for its own bucket, not the batch's
  longest.

The inputs of a step (token ids, rope positions, KV write positions) are written into one preallocated
``[3, num_slots]`` buffer with a single host-to-device copy; a captured graph reads them from there and leaves
its logits in one static output buffer, valid until the next step. Graphs read the weights and the KV pool
through the addresses they were captured with: weight updates copy into those tensors in place, and a change
of address (the pool or the weights reallocated, a LoRA adapter's layout changed) drops every graph, to be
captured again at next use into a fresh graph pool (``release``).

Which shapes are captured (``min_uses``, ``engine.decode_graph_min_uses``): a capture costs about three eager
steps (two warm-up runs and the capture itself), repaid only by a shape replayed several steps before the
engine sleeps (its graphs dropped). A shape is captured at its ``min_uses``-th step within a wake and runs
eagerly, at the same static shape and so to the same tokens, before that. The default, 1, captures at first
use: in simulated rollouts of the shipped recipes a few shapes run one or two steps but most run tens to
hundreds, and delaying every capture costs more than the few wasted ones save; docs/backends.md ("Which shapes
are captured") gives the cost model and the figures.

On CPU the same shapes run eagerly (``engine.decode_graphs: on``), which is what the CPU tests compare with
the dynamic path token for token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from asyncrl.engine.capture_turns import CaptureTurns
from asyncrl.engine.decode_plan import Group, batch_buckets, static_shape

logger = logging.getLogger(__name__)

WARMUP_RUNS = 2
"""Eager runs on the capture stream before a capture, so lazy initialisation (cuBLAS workspaces, autotuning)
happens outside the graph."""

Shape = tuple[int, tuple[Group, ...]]
"""(batch bucket, attention groups): one static decode shape, one graph."""


@dataclass
class WakeCounts:
    """What one wake's decode steps paid for capturing (the engine's life until its first sleep, then each
    wake to the next sleep): the capture cost a run under ``runtime.switch`` pays again every step."""

    captures: int = 0
    """Graphs captured (a recapture after the addresses moved counted again)."""
    capture_s: float = 0.0
    """Wall seconds of those captures, warm-up runs included."""
    eager_steps: int = 0
    """Steps run eagerly at their static shape while capturing is on: before their shape's ``min_uses``-th
    step, at a shape whose capture failed, or whose capture was deferred (``captures_deferred``)."""
    eager_shapes: set[Shape] = field(default_factory=set)
    """The distinct shapes those steps ran at."""
    replays: int = 0
    """Steps replayed from a captured graph."""
    captures_deferred: int = 0
    """Of ``eager_steps``, those that decoded eagerly because the trainer held the device's turn when their shape
    was due a capture (tried again at the shape's next step)."""

    def stats(self, prefix: str) -> dict[str, float]:
        """The counts as engine stats named ``{prefix}graph_captures``, ``{prefix}capture_s``, …"""
        return {
            f"{prefix}graph_captures": self.captures,
            f"{prefix}capture_s": self.capture_s,
            f"{prefix}eager_steps": self.eager_steps,
            f"{prefix}eager_step_shapes": len(self.eager_shapes),
            f"{prefix}graph_replays": self.replays,
            f"{prefix}captures_deferred": self.captures_deferred,
        }


UNENDED_GRAPHS: list[torch.cuda.CUDAGraph] = []
"""Graphs whose ``capture_end`` failed, never freed: PyTorch's pinned host allocator keeps calling a filter bound
to each (``StaticDecode._end_failed_capture``). One per failed capture, a few hundred bytes each."""

# (inputs [3, rows]: token ids, rope positions, KV write positions; attention groups) -> logits [rows, vocab]
DecodeFn = Callable[[torch.Tensor, tuple[Group, ...]], torch.Tensor]


class StaticDecode:
    """Runs ``decode`` at bucketed shapes over preallocated inputs; captures each bucket when ``capture``."""

    def __init__(
        self,
        decode: DecodeFn,
        *,
        num_slots: int,
        max_len: int,
        device: torch.device,
        capture: bool,
        fingerprint: Callable[[], tuple[int, ...]],
        turns: CaptureTurns | None = None,
        min_uses: int = 1,
    ) -> None:
        """``turns``: shared with a trainer on the same device in this process (the inline runtime), whose
        calls no capture may overlap (``engine.capture_turns``); None: this engine's own, always free.
        ``min_uses``: a shape is captured at its ``min_uses``-th step within a wake, run eagerly before
        (module docstring; ``engine.decode_graph_min_uses``)."""
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the engine serves on {device}")
        if min_uses < 1:
            raise ValueError(f"engine.decode_graph_min_uses must be >= 1, got {min_uses}")
        self.decode = decode
        self.min_uses = min_uses
        self.max_len = max_len
        self.buckets = batch_buckets(num_slots)
        self.capture = capture
        self.fingerprint = fingerprint
        """Addresses the graphs depend on (KV pool, weights); when they change the graphs are dropped."""
        self.turns = turns if turns is not None else CaptureTurns(timeout_s=0.0)
        self.inputs = torch.zeros(3, num_slots, dtype=torch.long, device=device)
        self.graphs: dict[Shape, torch.cuda.CUDAGraph] = {}
        self.uses: dict[Shape, int] = {}
        """Steps run at each shape this wake, up to its capture (``min_uses``); reset at each ``release``."""
        self.logits: torch.Tensor | None = None
        """Every graph's output, rows ``[0, batch)``: one ``[num_slots, vocab]`` buffer, not one per graph."""
        self._captured_for: tuple[int, ...] | None = None
        self.capture_error: str | None = None
        """Why capturing was turned off (the first capture failing other than for memory), or None."""
        self.eager_shapes: set[Shape] = set()
        """Shapes whose capture ran out of device memory: they decode eagerly for this engine's life, while
        other shapes go on capturing (the largest buckets fail first when the KV pool holds most of the
        device). Not retried after a wake: under ``runtime.switch`` that would pay a failing capture per step."""
        self._init_counts()
        self._init_capture_stream(device)

    def _init_counts(self) -> None:
        """What ``stats`` reports: failed captures and the capture counts, over the engine's life and per wake."""
        self.capture_failures = {"out_of_memory": 0, "other": 0}
        """Failed captures by reason, for ``stats``."""
        self.total = WakeCounts()
        """Captures, their seconds, eager, replayed and deferred steps over the engine's life, a recapture (the addresses
        moved, a wake after sleep) counted again: how many shapes a run paid a capture for, which ``graphs``
        (only the live ones) does not say. ``capture_s`` is wall time, warm-up runs included
        (``torch.cuda.graph`` synchronises the device on entry, so the time is the capture's own, not work
        queued before it)."""
        self.wake = WakeCounts()
        """The same, this wake only."""
        self.last_wake = WakeCounts()
        """The same for the wake that ended at the last ``release`` (a sleep): what an engine that sleeps every
        step (``runtime.switch``) paid in the rollout it just served, read while it sleeps."""

    def _init_capture_stream(self, device: torch.device) -> None:
        """The graph memory pool and the stream captures run on (None without ``capture``)."""
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        self._stream = torch.cuda.Stream(device) if self.capture else None
        """This engine's own stream for captures and their warm-up runs, not ``torch.cuda.graph``'s
        process-wide default one: the graphs of an engine left wedged in another thread could otherwise free
        the cuBLAS workspace that a new engine's graphs captured on the same stream embed (PyTorch keeps a
        cuBLAS workspace per handle and stream). One stream for both, made once: a fresh side stream per
        capture's warm-up (as before) left a cuBLAS workspace and the warm-up's cached blocks behind on each
        stream it drew from PyTorch's stream pool, and warming up on the capture stream itself makes that
        stream's workspace before the capture, outside the graph pool."""

    def release(self) -> None:
        """Drop every captured graph and the shared logits buffer, so that ``torch.cuda.empty_cache`` can
        return their memory pool to the device (an engine going to sleep, or the addresses the graphs read
        moving: ``_graph``); the next step captures again, into a fresh pool. Never the old one: blocks of it
        may outlive every graph (a graph still referenced elsewhere, or the capture stream's cuBLAS workspace,
        allocated inside the first capture on that stream and kept by cuBLAS for the process's life), and
        PyTorch refuses a capture into a pool that no graph holds but whose blocks live on
        (``create_or_incref_pool``'s ``use_count > 0`` assert), which would turn capturing off for good."""
        self._drop_graphs()
        self.uses.clear()
        self.last_wake, self.wake = self.wake, WakeCounts()

    def _drop_graphs(self) -> None:
        """``release`` less the wake's counts: the graphs, the logits buffer and the pool go, into a fresh one."""
        self.graphs.clear()
        self.logits = None
        self._captured_for = None
        if self.capture:
            self._pool = torch.cuda.graph_pool_handle()

    def stats(self) -> dict[str, float]:
        """Capture counts for the engine's ``stats``: over its life (``decode_*``: graphs captured, their
        seconds, steps run eagerly and at how many shapes, steps replayed, steps whose capture waited for the
        trainer's turn), the same for the last finished wake (``decode_wake_*``), failed captures by reason and
        shapes left eager after running out of memory."""
        return {
            **self.total.stats("decode_"),
            **self.last_wake.stats("decode_wake_"),
            "decode_capture_failures_out_of_memory": self.capture_failures["out_of_memory"],
            "decode_capture_failures_other": self.capture_failures["other"],
            "decode_shapes_eager": len(self.eager_shapes),
        }

    def shape_of(self, rope: list[int]) -> Shape:
        """The (batch, attention groups) bucket a step over rows at positions ``rope`` runs at: the batch
        padded to its bucket (idle rows at position 0), the groups' row counts to the batch ladder."""
        return static_shape(rope, self.buckets, self.max_len)

    def run(
        self,
        token_ids: list[int],
        rope: list[int],
        writes: list[int],
        shape: Shape | None = None,
    ) -> torch.Tensor:
        """Logits ``[bucket batch, vocab]`` for rows ``[0, len(token_ids))``; rows past them are padding.
        Row ``r`` attends over positions ``[0, rope[r]]``; ``shape`` is ``shape_of(rope)`` if the caller has it.

        The returned tensor is the graph's output buffer when captured: read it before the next step.
        """
        batch, groups = shape or self.shape_of(rope)
        pad = batch - len(token_ids)
        scratch = self.max_len
        host = torch.tensor([token_ids + [0] * pad, rope + [0] * pad, writes + [scratch] * pad])
        inputs = self.inputs[:, :batch]
        if not self.capture:
            inputs.copy_(host)
            return self.decode(inputs, groups)
        graph = self._graph(batch, groups)
        if graph is None:  # not captured yet, or its capture failed: the same shape, eagerly
            for counts in (self.total, self.wake):
                counts.eager_steps += 1
                counts.eager_shapes.add((batch, groups))
            inputs.copy_(host)
            return self.decode(inputs, groups)
        inputs.copy_(host, non_blocking=True)
        graph.replay()
        for counts in (self.total, self.wake):
            counts.replays += 1
        return self.logits[:batch]

    def _graph(self, batch: int, groups: tuple[Group, ...]) -> torch.cuda.CUDAGraph | None:
        """The bucket's graph, captured now if this is its ``min_uses``-th step this wake; None where that
        shape decodes eagerly (before then, or after its capture failed).

        A capture that runs out of device memory leaves that one shape eager (``eager_shapes``): a smaller
        bucket may still fit, and the eager step at the same shape allocates only its own intermediates.
        Any other failed capture turns capturing off for this engine, with a warning naming the error, instead
        of failing the step: such an error (an operation that cannot be captured) would recur at every shape,
        and eager static shapes give the same tokens. Addresses that moved within a wake drop the graphs but
        not the counts of steps: a shape already past ``min_uses`` is captured again at its next step."""
        shape = (batch, groups)
        if self.capture_error is not None or shape in self.eager_shapes:
            return None
        fingerprint = self.fingerprint()
        if fingerprint != self._captured_for:
            if self._captured_for is not None:  # graphs over the old addresses
                self._drop_graphs()  # into a fresh pool: never the old one (``release``)
            self._captured_for = fingerprint
        if shape in self.graphs:
            return self.graphs[shape]
        self.uses[shape] = self.uses.get(shape, 0) + 1
        if self.uses[shape] < self.min_uses:
            return None
        started = time.perf_counter()
        with self.turns.capture_turn() as free:
            if not free:  # the trainer works on this device: eagerly now, capture at a later step
                for counts in (self.total, self.wake):
                    counts.captures_deferred += 1
                return None
            try:
                self.graphs[shape] = self._capture(batch, groups)
            except RuntimeError as error:
                self._capture_failed(batch, groups, error)
                return None
        seconds = time.perf_counter() - started
        for counts in (self.total, self.wake):
            counts.captures += 1
            counts.capture_s += seconds
        return self.graphs[shape]

    def _capture_failed(self, batch: int, groups: tuple[Group, ...], error: RuntimeError) -> None:
        """Leave the shape eager after running out of memory, else turn capturing off; count it and warn."""
        if ran_out_of_memory(error):
            self.capture_failures["out_of_memory"] += 1
            self.eager_shapes.add((batch, groups))
            logger.warning(
                "CUDA graph capture of the decode step (batch %d, attention groups %s) ran out of device "
                "memory; that shape decodes eagerly from now on, other shapes still capture: %s",
                batch,
                groups,
                error,
            )
            return
        self.capture_failures["other"] += 1
        self.capture_error = f"{type(error).__name__}: {error}"
        self.graphs.clear()
        logger.warning(
            "CUDA graph capture of the decode step (batch %d, attention groups %s) failed, "
            "decoding eagerly at static shapes from now on: %s",
            batch,
            groups,
            self.capture_error,
        )

    def _capture(self, batch: int, groups: tuple[Group, ...]) -> torch.cuda.CUDAGraph:
        """Capture one bucket's step over idle inputs (every row writing to its scratch position, so neither
        the warm-up nor the capture touches a real row's KV).

        The graphs share one memory pool: they never run concurrently and each one's intermediates are dead
        once it has replayed; what outlives a replay is the logits, copied into ``self.logits``. The capture
        is thread-local so that another thread of the process (the inline trainer) may use the device
        meanwhile.

        The caller's stream is current again however this returns: ``torch.cuda.graph`` (torch 2.13,
        ``cuda/graphs.py``) enters its capture stream before ``capture_begin`` and leaves it only after
        ``capture_end`` succeeds, so a failed capture would leave the engine's thread on the capture stream,
        and the eager fallback would then run unordered with the trainer's copies on the default stream."""
        with torch.cuda.stream(torch.cuda.current_stream(self.inputs.device)):
            inputs = self.inputs[:, :batch]
            inputs[0].zero_()
            inputs[1].zero_()
            inputs[2].fill_(self.max_len)
            self._stream.wait_stream(torch.cuda.current_stream(inputs.device))
            with torch.cuda.stream(self._stream):
                for _ in range(WARMUP_RUNS):
                    logits = self.decode(inputs, groups)
            torch.cuda.current_stream(inputs.device).wait_stream(self._stream)
            if self.logits is None:
                self.logits = logits.new_empty(self.inputs.shape[1], logits.shape[1])
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(
                    graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
                ):
                    self.logits[:batch].copy_(self.decode(inputs, groups))
            except BaseException:
                self._end_failed_capture(graph)
                raise
            return graph

    def _end_failed_capture(self, graph: torch.cuda.CUDAGraph) -> None:
        """Leave the caching allocator as a successful capture would, after one that failed.

        ``CUDAGraph.capture_end`` (PyTorch's ``aten/src/ATen/cuda/CUDAGraph.cpp``) ends the stream's capture
        before it tells the allocator to stop routing allocations to the graph's pool (``endAllocateToPool``),
        so when ending the capture fails (a capture invalidated by an operation that cannot be captured) the
        allocator still lists a capture underway: its next ``empty_cache`` (this engine's sleep, the next
        capture's entry) fails an internal assert (``captures_underway.empty()``), and each allocation calls
        a filter bound to the dead graph. Ending it here fixes both; the call fails, harmlessly, where
        ``capture_end`` got as far as ending it (an out-of-memory error inside the capture leaves the capture
        valid, so it does) or capture never began. Where it did end it here, the failed graph's reference to the
        pool is dropped too (its ``reset`` drops one only after a successful ``capture_end``) and later
        captures take a fresh pool, never one a broken capture wrote into.

        What the Python API cannot reach: the pinned host allocator's own ``begin_allocate_to_pool``, which
        ``capture_begin`` also opens and only a successful ``capture_end`` closes. Its filter is bound to the
        graph object and called at every pinned allocation (a sleep at level 2 pins the weights), so the graph
        is kept alive for the process's life (``UNENDED_GRAPHS``, as the allocator is the process's): the
        filter then reads a live graph, whose capture is over, and routes nothing to its pool."""
        device = self.inputs.device.index  # a CUDA tensor's device always names its index
        try:
            torch._C._cuda_endAllocateToPool(device, self._pool)
        except RuntimeError:  # "not currently recording to mempool_id": capture_end closed it
            return
        torch._C._cuda_releasePool(device, self._pool)
        self._pool = torch.cuda.graph_pool_handle()
        UNENDED_GRAPHS.append(graph)


def ran_out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or one it was raised while handling, is a device out-of-memory error: an out-of-memory
    error inside ``torch.cuda.graph`` reaches the caller as ``capture_end``'s own error, should ending the
    capture fail too, with the out-of-memory error as its context."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, torch.OutOfMemoryError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
