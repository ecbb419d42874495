"""Moving one in-flight request, with its KV cache, from one engine to another serving the same version.

Key decision (DORA §4.4): when every token of a request was made by one policy version, its KV is the same on
any engine holding that version's weights, so a migrated request continues from its copied KV with no
re-prefill and samples exactly as if it had stayed (its sampling seed travels with it; the uniforms are
counter-based, keyed by that seed and the output position). A ``RequestState``
is plain data plus per-layer tensors, so it pickles across processes (Ray) unchanged.

Lifecycle of a migrated request: running (or waiting) on A → ``export_request`` (gone from A, its KV slot and
reservation released) → ``import_request`` on B (running in a free slot with its KV; or, if B has no free
slot or KV budget, waiting with its KV dropped, to be prefilled again: slower, never lost).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asyncrl.engine.sequence import Sequence, SequenceStatus, request_seed
from asyncrl.types import FinishReason, Generation, Request

if TYPE_CHECKING:
    from asyncrl.engine.llm_engine import LLMEngine

KVLayers = tuple[tuple[Any, Any], ...]
"""Per layer (keys, values), each ``[num_kv_heads, num_cached, head_dim]``."""


@dataclass(kw_only=True)
class RequestState:
    """Everything an engine needs to continue a request where another engine left it."""

    request: Request
    token_ids: list[int]
    """Prompt (and any continuation prefix) followed by the output so far."""
    output_logprobs: list[float]
    output_versions: list[int]
    version: int
    """The policy version of the engine it left: only an engine at this version may continue it."""
    num_cached: int = 0
    """Leading tokens whose KV is in ``kv`` (the rest are fed to the model again: the last sampled token)."""
    kv: KVLayers = ()
    sample_seed: int | None = None
    """The seed of the request's sampling uniforms; None: the importing engine derives it from the request."""
    elapsed_s: float = 0.0
    """Time since the request arrived at its first engine (its latency keeps counting after the move)."""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.request.prompt_token_ids) :]

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV this state carries (what a migration moves between engines)."""
        return sum(t.numel() * t.element_size() for layer in self.kv for t in layer)

    def partial_generation(self) -> Generation:
        """The output so far as an aborted Generation: what the source engine's caller receives on export."""
        return Generation(
            request_id=self.request_id,
            prompt_token_ids=list(self.request.prompt_token_ids),
            token_ids=self.output_token_ids,
            logprobs=list(self.output_logprobs),
            versions=list(self.output_versions),
            finish_reason=FinishReason.ABORT,
            timings=dict(self.timings),
        )


def export_request(engine: LLMEngine, seq: Sequence) -> RequestState:
    """Copy ``seq``'s state and KV out of ``engine`` and remove it there, freeing its slot and KV budget."""
    num_cached = seq.num_cached if seq.slot is not None else 0
    kv = read_kv(engine, seq.slot, num_cached) if num_cached else ()
    timings = dict(seq.timings)
    arrival = timings.pop("arrival", time.perf_counter())
    state = RequestState(
        request=seq.request,
        token_ids=list(seq.token_ids),
        output_logprobs=list(seq.output_logprobs),
        output_versions=list(seq.output_versions),
        version=engine.version,
        num_cached=num_cached,
        kv=kv,
        sample_seed=seq.sample_seed,
        elapsed_s=time.perf_counter() - arrival,
        timings=timings,
    )
    engine.scheduler.finish(seq, FinishReason.ABORT)
    return state


def import_request(engine: LLMEngine, state: RequestState) -> Sequence:
    """A sequence continuing ``state`` on ``engine``: running on its KV if a slot and budget are free now,
    else waiting with ``num_cached = 0`` (prefilled again). ``ValueError`` if the versions or KV shapes differ."""
    if state.version != engine.version:
        raise ValueError(
            f"request {state.request_id}: exported at version {state.version}, this engine serves "
            f"{engine.version}; KV is only reusable between engines of one version"
        )
    check_kv_shape(engine, state)
    seq = sequence_of(state, engine.config.seed)
    if state.num_cached and place_running(engine, seq):
        write_kv(engine, seq.slot, state.kv)
        seq.num_cached = state.num_cached
    else:
        engine.scheduler.add(seq)
    return seq


def sequence_of(state: RequestState, engine_seed: int) -> Sequence:
    seed = state.sample_seed if state.sample_seed is not None else request_seed(state.request, engine_seed)
    seq = Sequence(
        request=state.request,
        sample_seed=seed,
        token_ids=list(state.token_ids),
        output_logprobs=list(state.output_logprobs),
        output_versions=list(state.output_versions),
        timings=dict(state.timings),
    )
    seq.timings["arrival"] = time.perf_counter() - state.elapsed_s
    return seq


def place_running(engine: LLMEngine, seq: Sequence) -> bool:
    """Give ``seq`` a free slot and its KV reservation now, ahead of the waiting queue (it was already running
    elsewhere); False when no slot or budget is free. Mirrors ``Scheduler._admit`` for one sequence."""
    scheduler = engine.scheduler
    fits = scheduler.policy.admits(
        num_running=len(scheduler.running),
        kv_reserved=scheduler.kv_tokens_reserved,
        reservation=scheduler.reservation(seq),
    )
    if not fits:
        return False
    seq.slot = heapq.heappop(scheduler._free_slots)
    seq.status = SequenceStatus.RUNNING
    scheduler.kv_tokens_reserved += scheduler.reservation(seq)
    scheduler.running.append(seq)
    return True


def read_kv(engine: LLMEngine, slot: int, num_positions: int) -> KVLayers:
    """Copies of one slot's first ``num_positions`` KV positions, per layer."""
    cache = engine.runner.cache
    views = (cache.view(layer, slice(slot, slot + 1), num_positions) for layer in range(len(cache.keys)))
    return tuple((keys[0].clone(), values[0].clone()) for keys, values in views)


def write_kv(engine: LLMEngine, slot: int, kv: KVLayers) -> None:
    cache = engine.runner.cache
    for layer, (keys, values) in enumerate(kv):
        device, dtype = cache.keys[layer].device, cache.keys[layer].dtype
        cache.write_chunk(layer, slot, 0, keys.to(device, dtype)[None], values.to(device, dtype)[None])


def check_kv_shape(engine: LLMEngine, state: RequestState) -> None:
    if not state.num_cached:
        return
    cache = engine.runner.cache
    expected = (cache.keys[0].shape[1], state.num_cached, cache.keys[0].shape[3])
    shapes_ok = len(state.kv) == len(cache.keys) and all(
        tuple(t.shape) == expected for layer in state.kv for t in layer
    )
    if not shapes_ok:
        raise ValueError(
            f"request {state.request_id}: its KV does not fit this engine's cache "
            f"({len(cache.keys)} layers of {expected} expected)"
        )
    if state.num_cached > cache.max_len:
        raise ValueError(
            f"request {state.request_id}: {state.num_cached} KV positions exceed {cache.max_len}"
        )
