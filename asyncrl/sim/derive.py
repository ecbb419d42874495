"""Engine and trainer costs from first principles: a model shape, a hardware profile and the run's workload.

Key decision: every derived number is a roofline over quantities a spec sheet or the calibration probe gives
(bytes moved at a measured share of the bandwidth, FLOPs at a measured share of the peak), so a user can say
"Qwen3-8B on H800, 32 k responses" and get step times, and a reader can redo each one by hand:

- decode step (one accelerator) = ``overhead + max(weight bytes / (BW·η_w), batch · 2·P_active / (peak·η_c))
  + KV tokens · KV bytes per token / (BW·η_kv)``, which is the simulator's knee model with
  ``decode_step_s = weight bytes / (BW·η_w)`` and ``knee_batch = decode_step_s / (2·P_active / (peak·η_c))``;
- prefill per token = forward FLOPs at half the prompt's context / (peak·η_prefill);
- train per token = 3 forward FLOPs / (peak·η_train) + log-prob passes · forward FLOPs / (peak·η_logprob), at
  the mean attention context of a trained token;
- the KV that fits = memory · utilisation − weights / g, per GPU, over the KV bytes of a token
  (``shape.kv_bytes_per_token``: layers · 2 · KV heads · head dim · bytes); with paged KV it is the engine's
  budget that running contexts fill as they grow (preempting the newest when full), with reserved KV the pool
  that longest-context reservations fill;
- a weight update moves the served weights over each GPU's network link, plus a fixed reload time.

Mixtures of experts read every expert's weights each decode step (a batch of hundreds routes to all of them)
and compute with the active ones only.

Explicit keys win: ``load_sim_config`` derives only what the config file and overrides leave unset.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from asyncrl.config.base import from_dict
from asyncrl.config.loader import apply_overrides, read_yaml_file
from asyncrl.config.sim import SimConfig
from asyncrl.sim.hardware import HardwareProfile, resolve_profile
from asyncrl.sim.model_shape import ModelShape, resolve_shape
from asyncrl.sim.workload import LengthModel

LENGTH_SAMPLES = 4000
"""Responses drawn from the length model to take its moments (deterministic per seed)."""


def load_sim_config(path: str | None, overrides: Sequence[str] = ()) -> SimConfig:
    """The YAML file plus overrides as a ``SimConfig``; with ``model`` and ``hardware`` set, every engine and
    trainer cost key the file and overrides leave unset is derived (``derived_keys``)."""
    data = read_yaml_file(path) if path is not None else {}
    data = apply_overrides(SimConfig, data, overrides)
    config = from_dict(SimConfig, data)
    if not config.model:
        return config
    derived = derived_keys(config, resolve_shape(config.model), resolve_profile(config.hardware))
    return from_dict(SimConfig, _merge_under(derived, data))


def _merge_under(defaults: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
    """``explicit`` on top of ``defaults``, section by section."""
    merged = copy.deepcopy(defaults)
    for key, value in explicit.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge_under(merged[key], value)
        else:
            merged[key] = value
    return merged


def derived_keys(config: SimConfig, shape: ModelShape, profile: HardwareProfile) -> dict[str, dict[str, Any]]:
    """``engine`` and ``trainer`` cost keys for ``config``'s workload, parallelism and software assumptions."""
    return {"engine": engine_keys(config, shape, profile), "trainer": trainer_keys(config, shape, profile)}


def weight_bytes(config: SimConfig, shape: ModelShape) -> float:
    return shape.num_params * config.cost.bytes_per_param


def decode_read_bytes(config: SimConfig, shape: ModelShape) -> float:
    """Weights a decode step reads: every layer (all experts) and the output layer, not the input embedding
    (a lookup of a few rows)."""
    read = shape.num_params - shape.embedding_params + shape.vocab * shape.hidden
    return read * config.cost.bytes_per_param


def kv_tokens_that_fit(config: SimConfig, shape: ModelShape, profile: HardwareProfile) -> int:
    """KV tokens an engine of ``engine.gpus_per_engine`` accelerators holds beside its share of the weights."""
    gpus = config.engine.gpus_per_engine
    per_gpu = profile.hbm_bytes * config.cost.memory_utilization - weight_bytes(config, shape) / gpus
    if per_gpu <= 0:
        raise ValueError(
            f"model {shape.name!r} ({weight_bytes(config, shape) / 1e9:.1f} GB of weights) does not fit an engine "
            f"of {gpus} {profile.name} GPU(s) at cost.memory_utilization={config.cost.memory_utilization}: raise "
            f"engine.gpus_per_engine"
        )
    return int(gpus * per_gpu // shape.kv_bytes_per_token(config.cost.bytes_per_param))


def length_moments(config: SimConfig) -> tuple[float, float]:
    """(E[L], E[L²]) of the response lengths the run draws (clipped to ``rollout.max_new_tokens``)."""
    lengths = LengthModel(config.lengths, config.rollout.max_new_tokens, config.seed)
    group = max(1, config.rollout.num_return_sequences)
    draws = [lengths(f"q{i // group}@0#{i % group}") for i in range(LENGTH_SAMPLES)]
    return sum(draws) / len(draws), sum(d * d for d in draws) / len(draws)


def mean_running_context(config: SimConfig) -> float:
    """Context tokens of a request running at a random moment: its prompt plus, on average, half of a
    length-biased response (a request of length L runs L steps holding about L/2 of output), E[L²] / 2E[L]."""
    mean, square = length_moments(config)
    return config.prompt_tokens + square / (2 * mean)


def mean_attention_context(config: SimConfig) -> float:
    """Positions a trained token attends to on average: half its sequence, weighted by sequence length."""
    mean, square = length_moments(config)
    prompt = config.prompt_tokens
    return (prompt * prompt + 2 * prompt * mean + square) / (2 * (prompt + mean))


def engine_keys(config: SimConfig, shape: ModelShape, profile: HardwareProfile) -> dict[str, Any]:
    eff = profile.efficiency
    decode_s = decode_read_bytes(config, shape) / (profile.hbm_bandwidth * eff.decode_weights)
    per_request_s = 2 * shape.active_params_per_token / (profile.peak_flops * eff.decode_compute)
    kv_tokens = kv_tokens_that_fit(config, shape, profile)
    longest = config.prompt_tokens + config.rollout.max_new_tokens
    if config.cost.kv == "paged":  # the engine allocates as contexts grow and preempts when they outgrow it
        running, max_kv = config.cost.max_num_seqs, kv_tokens
        if longest > kv_tokens:
            raise ValueError(
                f"cost.kv=paged: one request's longest context ({longest} tokens) exceeds the KV that fits an "
                f"engine ({kv_tokens} tokens)"
            )
    else:
        running, max_kv = config.cost.max_num_seqs, kv_tokens
        if longest > kv_tokens:
            raise ValueError(
                f"cost.kv=reserved: one request's longest context ({longest} tokens) exceeds the KV that fits an "
                f"engine ({kv_tokens} tokens)"
            )
    return {
        "decode_step_s": decode_s,
        "knee_batch": max(1, round(decode_s / per_request_s)),
        "decode_overhead_s": shape.num_layers * eff.decode_overhead_per_layer_s,
        "decode_s_per_request": 0.0,
        "kv_s_per_token": shape.kv_bytes_per_token(config.cost.bytes_per_param)
        / (profile.hbm_bandwidth * eff.decode_kv),
        "prefill_s_per_token": shape.forward_flops_per_token(config.prompt_tokens / 2)
        / (profile.peak_flops * eff.prefill),
        "max_running_requests": running,
        "max_kv_tokens": max_kv,
        "kv_allocation": config.cost.kv,
        "num_layers": shape.num_layers,
        "allreduce_hop_s": profile.intra_node_latency_s,
        "kv_bytes_per_token": shape.kv_bytes_per_token(config.cost.bytes_per_param),
        "weight_update_s": _weight_transfer_s(config, shape, profile) + config.cost.weight_reload_s,
    }


def _weight_transfer_s(config: SimConfig, shape: ModelShape, profile: HardwareProfile) -> float:
    """Moving one version's served weights to an engine: over the network link, or colocated on the device
    itself (``colocated_switch_parts``' ``sync``)."""
    if config.trainer.colocated:
        return colocated_switch_parts(config, shape, profile)["sync"]
    return weight_bytes(config, shape) / profile.inter_node_bandwidth


def colocated_switch_parts(
    config: SimConfig, shape: ModelShape, profile: HardwareProfile
) -> dict[str, float]:
    """Seconds of each part of one step's colocated switch (``runtime.switch``), per accelerator, from the
    bytes it moves and the bandwidth they move at (docs/simulator.md):

    - ``offload``: the trainer's state (``cost.switch_offload_bytes_per_param`` per parameter, sharded over
      the trainer's accelerators) to host memory and back: twice over the host link;
    - ``engine_weights``: at ``cost.switch_sleep_level`` 2, an engine's served weights (its share per
      accelerator) to host memory and back: twice over the host link; 0 at level 1;
    - ``kv``: the freed KV pool allocated and zeroed again on wake: one write of it at HBM bandwidth;
    - ``sync``: the weights by CUDA IPC: the trainer packs a served-dtype copy (one write), the engine reads
      it and writes its own (one read, one write): three passes of the served weights at HBM bandwidth;
    - ``fixed``: ``cost.switch_fixed_s``.
    """
    cost, engine_gpus = config.cost, config.engine.gpus_per_engine
    host, hbm = profile.host_link_bandwidth, profile.hbm_bandwidth * profile.efficiency.decode_kv
    served = weight_bytes(config, shape) / engine_gpus
    kv_pool = profile.hbm_bytes * cost.memory_utilization - served
    return {
        "offload": 2 * cost.switch_offload_bytes_per_param * shape.num_params / config.num_train_gpus / host,
        "engine_weights": 2 * served / host if cost.switch_sleep_level == 2 else 0.0,
        "kv": max(kv_pool, 0.0) / hbm,
        "sync": 3 * served / hbm,
        "fixed": cost.switch_fixed_s,
    }


def trainer_keys(config: SimConfig, shape: ModelShape, profile: HardwareProfile) -> dict[str, Any]:
    eff = profile.efficiency
    forward = shape.forward_flops_per_token(mean_attention_context(config))
    per_token = 3 * forward / (profile.peak_flops * eff.train) + config.cost.logprob_passes * forward / (
        profile.peak_flops * eff.logprob
    )
    gpus = config.num_train_gpus
    # AdamW touches float32 master weights, gradients and two moments: ~16 B read and 16 B written per param.
    optimizer_s = 32 * shape.num_params / (profile.hbm_bandwidth * eff.decode_kv * gpus)
    switch_s = 0.0
    if config.trainer.colocated:  # the switch between rollout and training; its weight copy is the update's
        parts = colocated_switch_parts(config, shape, profile)
        switch_s = sum(seconds for part, seconds in parts.items() if part != "sync")
    return {"gpu_s_per_token": per_token, "step_overhead_s": optimizer_s + switch_s}
