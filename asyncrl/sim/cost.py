"""The cost models as pure arithmetic: decode steps, segments of steps, training steps.

Key decision: an engine's running batch only changes at step boundaries, so between two changes every step
has a known cost and the time of the next finish is a closed form (the KV term grows by the batch size
each step: an arithmetic series). The simulated engine jumps from change to change instead of stepping.

A tensor-parallel engine of g accelerators divides every compute term by g and pays its all-reduces once per
step (``tp_allreduce_s``), so it is faster per step than one accelerator but never g times faster.
"""

from __future__ import annotations

from asyncrl.config.sim import SimEngineConfig, SimTrainerConfig

ALLREDUCES_PER_LAYER = 2
"""Megatron-style tensor parallelism joins the shards after attention and after the MLP of every layer."""


def ring_hops(num_gpus: int) -> int:
    """Hops of one ring all-reduce over ``num_gpus`` accelerators: g-1 to reduce-scatter, g-1 to gather."""
    return 2 * (num_gpus - 1)


def tp_allreduce_s(config: SimEngineConfig) -> float:
    """The all-reduce time of one decode step of the engine's tensor-parallel group (0 on one accelerator)."""
    hops = ring_hops(config.gpus_per_engine)
    return config.num_layers * ALLREDUCES_PER_LAYER * hops * config.allreduce_hop_s


def decode_step_s(config: SimEngineConfig, num_running: int, num_kv_tokens: int) -> float:
    """One decode step: flat up to ``knee_batch`` running requests, then linear; plus a per-request and a
    per-KV-token term; that compute split over the tensor-parallel group, plus its all-reduces and the fixed
    per-step overhead (small kernels, launches: as long on every accelerator of the group)."""
    batch_factor = max(1.0, num_running / config.knee_batch)
    compute_s = (
        config.decode_step_s * batch_factor
        + config.decode_s_per_request * num_running
        + config.kv_s_per_token * num_kv_tokens
    )
    return compute_s / config.gpus_per_engine + tp_allreduce_s(config) + config.decode_overhead_s


def prefill_s(config: SimEngineConfig, num_tokens: int) -> float:
    """Prefill of ``num_tokens`` context tokens, split over the tensor-parallel group (its all-reduces ride
    on the step's own)."""
    return num_tokens * config.prefill_s_per_token / config.gpus_per_engine


def segment_s(
    config: SimEngineConfig, num_running: int, num_kv_tokens: int, num_steps: int, prefill_s: float = 0.0
) -> float:
    """Time of ``num_steps`` steps of a fixed batch whose KV starts at ``num_kv_tokens`` and grows by
    ``num_running`` per step, plus ``prefill_s`` paid in the first step (0 steps take no time)."""
    if num_steps <= 0:
        return 0.0
    first = decode_step_s(config, num_running, num_kv_tokens)
    kv_growth = config.kv_s_per_token * num_running * num_steps * (num_steps - 1) / 2
    return prefill_s + num_steps * first + kv_growth / config.gpus_per_engine


def steps_done(
    config: SimEngineConfig,
    num_running: int,
    num_kv_tokens: int,
    elapsed_s: float,
    max_steps: int,
    prefill_s: float = 0.0,
) -> int:
    """Whole steps of such a segment finished within ``elapsed_s`` (at most ``max_steps``)."""
    low, high = 0, max_steps
    while low < high:
        mid = (low + high + 1) // 2
        if segment_s(config, num_running, num_kv_tokens, mid, prefill_s) <= elapsed_s + 1e-12:
            low = mid
        else:
            high = mid - 1
    return low


def train_step_s(config: SimTrainerConfig, num_gpus: int, num_tokens: int) -> float:
    """One training step over ``num_tokens`` tokens on ``num_gpus`` accelerators."""
    return config.step_overhead_s + config.epochs * num_tokens * config.gpu_s_per_token / num_gpus
