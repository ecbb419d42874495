"""The built-in engine's own CUDA stream, and the one rule that orders every hand-off across it.

Why: in the inline runtime the engine steps on its thread (``asyncrl-engine``) while the trainer trains on
another (``asyncrl-trainer``). On one stream the device would run their kernels one after the other, and each
decode step's copy of its sampled tokens to the host would wait for every trainer kernel queued ahead of it:
"async on one GPU" would be serialised. So on CUDA (``engine.cuda_stream: own``, the default) the engine
thread issues all its work on a stream of its own. PyTorch's current stream is per thread (torch 2.13,
``include/c10/cuda/CUDAStream.h``: "the notion of 'current stream for device' is thread local (every OS thread
has a separate current stream)"; ``torch.cuda.stream``/``set_stream`` set it for the calling thread only), so
setting it once around the engine thread's loop moves every kernel that thread issues, and no other thread's.
Every other thread of the process (the trainer's, the controller's, a prefetch worker's) issues on the
device's default stream: nothing in asyncrl sets another stream for them.

Two streams need ordering wherever device memory crosses between them. ``EngineStream.handoff`` is that one
rule, applied by ``AsyncEngine`` to every engine command that takes device memory in or gives it out:

1. before: the engine stream is drained (``synchronize``), so no engine kernel is still in flight over memory
   the command frees or overwrites (a prefill-only step ends without a host sync), and it waits on the default
   stream (``wait_stream``), so everything other threads queued before handing over (the trainer's clones of
   its weights, a packed colocated block) is done before the command's kernels read it;
2. after (also on error): the engine stream is drained again, so when the caller hears back the command's
   copies are complete: the caller may then free, overwrite or reuse what it handed over (the trainer's next
   optimizer step, a colocated block released after ``weights_applied``, a CUDA IPC block in another process
   whose memory this process's allocator cannot track), and may read what the engine handed out.

That is the "kept alive until the consumer's work completes" form of stream safety: every handed-over tensor
is referenced by the caller until its command returns, so ``record_stream`` is never needed.

The hand-offs (all through ``AsyncEngine``; found by reading ``engine/llm_engine.py`` and ``runtime/inline.py``):
- construction: ``LLMEngine`` is built on the caller's thread (default stream: the cast, the KV pool's zero
  fill, the static decode buffers); the engine thread's stream waits on it once, when the loop starts
  (``serving``);
- ``update_weights``: a full update from the in_process transport (clones made on the trainer thread), the
  colocated transport's in-process path (the trainer's packed CUDA block) and its CUDA IPC path, the delta
  transport's in-place patch, a LoRA adapter merged into the base weights, named tensors a caller built;
- ``apply_bucket``: one bucket of a streamed broadcast (a Ray engine actor's, or any caller's);
- ``sleep`` (memory given back to the device for the trainer) and ``wake`` (weights and a KV pool back);
- ``export_request`` (KV copies handed out, to another engine's thread) and ``import_request`` (KV written in).
Nothing else crosses: generations reach callers as host lists (the sampler's ``tolist`` waits on the engine
stream only), ``finish_stream``, ``pause``, ``resume``, ``abort`` and ``add`` touch no device memory, and a
prefetch (delta transport) reads files into host memory.

Static CUDA-graph decode (``engine.static_decode``) stays right on the engine's stream: it captures on its
own capture stream after ``torch.cuda.graph`` synchronises the device, warms up on a side stream that waits on
the current one, and replays on the current stream: the engine's.

``engine.cuda_stream: default`` (or any non-CUDA device) makes all of this a no-op: the engine issues on the
default stream as before, so the GPU kit can measure both. Not yet run on a GPU (see docs/scaling.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from asyncrl.config.engine import CUDA_STREAMS

T = TypeVar("T")


class EngineStream:
    """One engine's stream and the stream every other thread of its process issues on (module docstring).
    With ``stream`` None (CPU, or ``engine.cuda_stream: default``) every method is a no-op."""

    def __init__(self, stream: Any = None, producer: Any = None) -> None:
        if (stream is None) != (producer is None):
            raise ValueError("EngineStream needs both its own stream and the producers' stream, or neither")
        self.stream = stream
        self.producer = producer

    @classmethod
    def for_device(cls, device: torch.device, mode: str) -> EngineStream:
        """The engine's stream on ``device`` in ``mode`` (``engine.cuda_stream``): its own on CUDA with
        ``own``, none otherwise."""
        if mode not in CUDA_STREAMS:
            raise ValueError(f"engine.cuda_stream must be one of {CUDA_STREAMS}, got {mode!r}")
        if device.type != "cuda" or mode == "default":
            return cls()
        return cls(torch.cuda.Stream(device), torch.cuda.default_stream(device))

    @property
    def mode(self) -> str:
        """What runs: ``own`` (a stream of its own) or ``default`` (the device's default stream, or no CUDA)."""
        return "default" if self.stream is None else "own"

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around the engine thread's loop: the engine's stream is this thread's current stream, after it
        waited for the engine's construction on the default stream."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(self.producer)
        with torch.cuda.stream(self.stream):
            yield

    def handoff(self, fn: Callable[[], T]) -> T:
        """``fn()`` (an engine command that takes in or gives out device memory) ordered against the other
        threads' stream: drained and waiting on it before, drained after (module docstring, rule 1 and 2)."""
        if self.stream is None:
            return fn()
        self.stream.synchronize()
        self.stream.wait_stream(self.producer)
        try:
            return fn()
        finally:
            self.stream.synchronize()
