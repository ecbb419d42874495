"""Decode steps at bucketed static shapes, each bucket captured once as a CUDA graph on CUDA.

Why: a decode step of a small model is a few hundred tiny kernels; launched one by one from Python it costs
tens of milliseconds whatever the batch (the H200 probe measured 35–80 ms against 4–14 ms for the same model
in a captured static loop). A CUDA graph replays them all in one launch, but only at the shapes it was
captured with, so a step runs at its bucket's shape instead of its own:

- batch: the step's rows ``[0, num_rows)`` padded to the next batch bucket (1, 2, 4, … up to the slot count);
  the padded rows are idle slots: token 0 at position 0, their KV write going to the scratch position;
- KV length: the step's longest context padded to the next power of two (at least ``MIN_LENGTH_BUCKET``,
  at most the pool's length); the attention mask hides every position past a row's own.

The inputs of a step (token ids, rope positions, KV write positions) are written into one preallocated
``[3, num_slots]`` buffer with a single host-to-device copy; a captured graph reads them from there and leaves
its logits in one static output buffer, valid until the next step. Graphs read the weights and the KV pool
through the addresses they were captured with: weight updates copy into those tensors in place, and a change
of address (the pool or the weights reallocated) drops every graph, to be captured again at next use.

On CPU the same shapes run eagerly (``engine.decode_graphs: on``), which is what the CPU tests compare with
the dynamic path token for token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 64
"""Shortest KV-length bucket: below it the attention's cost is lost in the step's fixed cost."""

WARMUP_RUNS = 2
"""Eager runs on a side stream before a capture, so lazy initialisation (cuBLAS workspaces, autotuning)
happens outside the graph."""

# (inputs [3, rows]: token ids, rope positions, KV write positions; KV length) -> logits [rows, vocab]
DecodeFn = Callable[[torch.Tensor, int], torch.Tensor]


def batch_buckets(num_slots: int) -> list[int]:
    """1, 2, 4, … below ``num_slots``, then ``num_slots`` itself: every batch a step can have fits one."""
    buckets, size = [], 1
    while size < num_slots:
        buckets.append(size)
        size *= 2
    return [*buckets, num_slots]


def length_bucket(length: int, max_len: int) -> int:
    """The KV length a step with longest context ``length`` attends over: the next power of two, at least
    ``MIN_LENGTH_BUCKET``, at most ``max_len`` (the pool's real positions; the scratch one is never read)."""
    if not 1 <= length <= max_len:
        raise ValueError(f"decode length {length} is outside [1, {max_len}]")
    bucket = MIN_LENGTH_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, max_len)


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
    ) -> None:
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the engine serves on {device}")
        self.decode = decode
        self.max_len = max_len
        self.buckets = batch_buckets(num_slots)
        self.capture = capture
        self.fingerprint = fingerprint
        """Addresses the graphs depend on (KV pool, weights); when they change the graphs are dropped."""
        self.inputs = torch.zeros(3, num_slots, dtype=torch.long, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: torch.Tensor | None = None
        """Every graph's output, rows ``[0, batch)``: one ``[num_slots, vocab]`` buffer, not one per graph."""
        self._captured_for: tuple[int, ...] | None = None
        self.capture_error: str | None = None
        """Why capturing was turned off (the first failed capture), or None while it works."""
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def release(self) -> None:
        """Drop every captured graph and the shared logits buffer, so that ``torch.cuda.empty_cache`` can
        return their memory pool to the device (an engine going to sleep); the next step captures again."""
        self.graphs.clear()
        self.logits = None
        self._captured_for = None

    def shape_of(self, num_rows: int, length: int) -> tuple[int, int]:
        """The (batch, KV length) bucket a step over ``num_rows`` rows and longest context ``length`` runs at."""
        batch = next(b for b in self.buckets if b >= num_rows)
        return batch, length_bucket(length, self.max_len)

    def run(self, token_ids: list[int], rope: list[int], writes: list[int], length: int) -> torch.Tensor:
        """Logits ``[bucket batch, vocab]`` for rows ``[0, len(token_ids))``; rows past them are padding.

        The returned tensor is the graph's output buffer when captured: read it before the next step.
        """
        batch, bucket_length = self.shape_of(len(token_ids), length)
        pad = batch - len(token_ids)
        scratch = self.max_len
        host = torch.tensor([token_ids + [0] * pad, rope + [0] * pad, writes + [scratch] * pad])
        inputs = self.inputs[:, :batch]
        if not self.capture:
            inputs.copy_(host)
            return self.decode(inputs, bucket_length)
        graph = self._graph(batch, bucket_length)
        if graph is None:  # capture failed: the same shapes, eagerly
            inputs.copy_(host)
            return self.decode(inputs, bucket_length)
        inputs.copy_(host, non_blocking=True)
        graph.replay()
        return self.logits[:batch]

    def _graph(self, batch: int, length: int) -> torch.cuda.CUDAGraph | None:
        """The bucket's graph, captured now if new; None once a capture has failed.

        A failed capture turns capturing off for this engine with a warning naming the error, instead of
        failing the step: the path has not yet run on a GPU, and eager static shapes give the same tokens."""
        if self.capture_error is not None:
            return None
        fingerprint = self.fingerprint()
        if fingerprint != self._captured_for:
            self.graphs.clear()
            self._captured_for = fingerprint
        if (batch, length) not in self.graphs:
            try:
                self.graphs[batch, length] = self._capture(batch, length)
            except RuntimeError as error:
                self.capture_error = f"{type(error).__name__}: {error}"
                self.graphs.clear()
                logger.warning(
                    "CUDA graph capture of the decode step (batch %d, KV length %d) failed, decoding "
                    "eagerly at static shapes from now on: %s",
                    batch,
                    length,
                    self.capture_error,
                )
                return None
        return self.graphs[batch, length]

    def _capture(self, batch: int, length: int) -> torch.cuda.CUDAGraph:
        """Capture one bucket's step over idle inputs (every row writing to its scratch position, so neither
        the warm-up nor the capture touches a real row's KV).

        The graphs share one memory pool: they never run concurrently and each one's intermediates are dead
        once it has replayed; what outlives a replay is the logits, copied into ``self.logits``. The capture
        is thread-local so that another thread of the process (the inline trainer) may use the device
        meanwhile."""
        inputs = self.inputs[:, :batch]
        inputs[0].zero_()
        inputs[1].zero_()
        inputs[2].fill_(self.max_len)
        side = torch.cuda.Stream(device=inputs.device)
        side.wait_stream(torch.cuda.current_stream(inputs.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                logits = self.decode(inputs, length)
        torch.cuda.current_stream(inputs.device).wait_stream(side)
        if self.logits is None:
            self.logits = logits.new_empty(self.inputs.shape[1], logits.shape[1])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self.logits[:batch].copy_(self.decode(inputs, length))
        return graph
