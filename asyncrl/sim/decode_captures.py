"""The static decode shapes a rollout meets on the built-in engine, and what capturing them costs (no torch).

Why: on CUDA every static decode shape (``engine.decode_plan.static_shape``) is a CUDA graph to capture, and
under the colocated switch (``runtime.switch``) every sleep drops them all, so each rollout captures its shapes
again. How many shapes a rollout meets, and how often it runs each, depends on what the scheduler does:
admission by slots and KV reservation, continuous refill as rows end, chunked prefill (a row still prefilling
idles at position 0 in the decode batch), compaction and the slot order by length level. So the rollout here
is the real ``Scheduler`` driven over simulated requests, each step's decode batch planned as
``ModelRunner._decode`` plans it.

The cost model, in eager decode steps ``e`` of the same shape (the decode time a captured graph saves is
a host-bound step's: about the same at every shape of a small model, docs/backends.md):

- a step run eagerly costs ``e``;
- a capture costs ``CAPTURE_EAGER_STEPS`` ``e``: ``static_decode.WARMUP_RUNS`` eager warm-up runs and the
  captured run itself;
- a replayed step costs ``r·e``, ``r`` (``replay_ratio``) the probe's static-loop step over the engine's
  eager one.

A shape is captured at its ``min_uses``-th step within a wake (``engine.decode_graph_min_uses``): that step
captures and replays, the steps before it run eagerly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from asyncrl.engine.decode_plan import Group, batch_buckets, static_shape
from asyncrl.engine.scheduler import Scheduler
from asyncrl.engine.sequence import Sequence as EngineSequence
from asyncrl.types import FinishReason, Request, SamplingParams

Shape = tuple[int, tuple[Group, ...]]

CAPTURE_EAGER_STEPS = 3
"""A capture's cost in eager steps: two warm-up runs (``static_decode.WARMUP_RUNS``) and the run captured."""

REPLAY_RATIO = 0.15
"""A replayed step's time over an eager one's: the H200 probe's static CUDA-graph loop over the engine's step
(docs/gpu-smoke/2026-11-27-h200-probe.json), median over Qwen3 0.6B-8B at batch 1-256: 0.145 (0.075-0.55).
The engine's eager decode alone (its ``ModelRunner``, without scheduling and sampling) gives 0.27 (0.14-0.87)."""


def decode_shapes(
    prompts: Sequence[int],
    outputs: Sequence[int],
    *,
    num_slots: int,
    max_model_len: int,
    max_kv_tokens: int,
    max_prefill_tokens_per_step: int = 2048,
) -> list[Shape]:
    """The static shape of every decode step of one rollout: request ``i`` has a prompt of ``prompts[i]``
    tokens and runs to ``outputs[i]`` output tokens (or the context cap), all queued at once, as a sync step's
    requests reach the engine; the engine admits, refills and orders them as ``LLMEngine`` does."""
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} output lengths")
    scheduler = Scheduler(
        max_running_requests=num_slots,
        max_kv_tokens=max_kv_tokens,
        max_prefill_tokens_per_step=max_prefill_tokens_per_step,
        max_model_len=max_model_len,
    )
    for index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        sampling = SamplingParams(max_new_tokens=output, ignore_eos=True)
        request = Request(request_id=str(index), prompt_token_ids=[0] * prompt, sampling=sampling)
        scheduler.add(EngineSequence.from_request(request, 0))
    buckets = batch_buckets(num_slots)
    shapes = []
    while scheduler.has_work:
        _, chunks = scheduler.schedule()
        decoding = [chunk for chunk in chunks if chunk.num_tokens == 1]
        if decoding:  # rows of slots [0, in use) not decoding this step idle at position 0
            rope = [0] * scheduler.num_slots_in_use
            for chunk in decoding:
                rope[chunk.seq.slot] = chunk.start
            shapes.append(static_shape(rope, buckets, max_model_len))
        for seq in scheduler.commit(chunks):
            seq.append(0, 0.0, 0)
            if (
                seq.num_output_tokens >= seq.request.sampling.max_new_tokens
                or seq.num_tokens >= max_model_len
            ):
                scheduler.finish(seq, FinishReason.LENGTH)
    return shapes


def uses_per_shape(shapes: Iterable[Shape]) -> list[int]:
    """How many steps ran at each distinct shape, in order of first use."""
    return list(Counter(shapes).values())


def wake_cost(
    uses: Iterable[int],
    min_uses: int,
    replay_ratio: float = REPLAY_RATIO,
    capture_steps: float = CAPTURE_EAGER_STEPS,
) -> float:
    """Decode time of one wake's steps, in eager steps, where the wake ran ``uses[s]`` steps at shape ``s``
    and captures each shape at its ``min_uses``-th step (module docstring); ``capture_steps``: a capture's
    cost, for the sensitivity to it (a capture's first warm-up may cost more than a step)."""
    total = 0.0
    for count in uses:
        if count < min_uses:
            total += count
        else:
            total += min_uses - 1 + capture_steps + (count - min_uses + 1) * replay_ratio
    return total


def capture_overhead(uses: Iterable[int], min_uses: int, replay_ratio: float = REPLAY_RATIO) -> float:
    """What a wake pays beyond replaying every step, in eager steps: the captures, and the steps run eagerly
    before their shape's capture or at a shape never captured. The simulator's decode cost is the replayed
    step (a static-loop bound), so this is what it adds for a wake."""
    uses = list(uses)
    return wake_cost(uses, min_uses, replay_ratio) - replay_ratio * sum(uses)


def captured_shapes(uses: Iterable[int], min_uses: int) -> int:
    """Shapes a wake captures: those it runs at least ``min_uses`` steps."""
    return sum(1 for count in uses if count >= min_uses)


@lru_cache(maxsize=64)
def rollout_overhead(
    prompts: tuple[int, ...],
    outputs: tuple[int, ...],
    *,
    num_slots: int,
    max_model_len: int,
    max_kv_tokens: int,
    min_uses: int,
    replay_ratio: float = REPLAY_RATIO,
) -> tuple[int, float]:
    """(shapes captured, capture overhead in eager steps) of one rollout over a fresh wake; cached, since the
    simulator asks once per configuration and the rollout takes a second or so to plan."""
    uses = uses_per_shape(
        decode_shapes(
            prompts, outputs, num_slots=num_slots, max_model_len=max_model_len, max_kv_tokens=max_kv_tokens
        )
    )
    return captured_shapes(uses, min_uses), capture_overhead(uses, min_uses, replay_ratio)
