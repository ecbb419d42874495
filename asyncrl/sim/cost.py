"""The cost models as pure arithmetic: decode steps, segments of steps, training steps.

Key decision: an engine's running batch only changes at step boundaries, so between two changes every step
has a known cost and the time of the next finish is a closed form (the KV term grows by the batch size
each step: an arithmetic series). The simulated engine jumps from change to change instead of stepping.
"""

from __future__ import annotations

from asyncrl.config.sim import SimEngineConfig, SimTrainerConfig


def decode_step_s(config: SimEngineConfig, num_running: int, num_kv_tokens: int) -> float:
    """One decode step: flat up to ``knee_batch`` running requests, then linear; plus a per-KV-token term."""
    batch_factor = max(1.0, num_running / config.knee_batch)
    return config.decode_step_s * batch_factor + config.kv_s_per_token * num_kv_tokens


def segment_s(
    config: SimEngineConfig, num_running: int, num_kv_tokens: int, num_steps: int, prefill_s: float = 0.0
) -> float:
    """Time of ``num_steps`` steps of a fixed batch whose KV starts at ``num_kv_tokens`` and grows by
    ``num_running`` per step, plus ``prefill_s`` paid in the first step (0 steps take no time)."""
    if num_steps <= 0:
        return 0.0
    first = decode_step_s(config, num_running, num_kv_tokens)
    growth = config.kv_s_per_token * num_running * num_steps * (num_steps - 1) / 2
    return prefill_s + num_steps * first + growth


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
