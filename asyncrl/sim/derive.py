"""Engine and trainer costs from first principles: a model shape, a hardware profile and the run's workload.

Key decision: every derived number is a roofline over quantities a spec sheet or the calibration probe gives
(bytes moved at a measured share of the bandwidth, FLOPs at a measured share of the peak), so a user can say
"Qwen3-8B on H800, 32 k responses" and get step times, and a reader can redo each one by hand:

- decode step (one accelerator) = ``overhead + max(weight bytes / (BW·η_w), batch · 2·P_active / (peak·η_c))
  + KV tokens · KV bytes per token / (BW·η_kv)``, which is the simulator's knee model with
  ``decode_step_s = weight bytes / (BW·η_w)`` and ``knee_batch = decode_step_s / (2·P_active / (peak·η_c))``;
- prefill per token = forward FLOPs at half the prompt's context / (peak·η_prefill);
- train per token = training FLOPs / (peak·η_train) + no-grad FLOPs / (peak·η_logprob), at the mean attention
  context of a trained token: 3 forwards and the log-prob passes' forwards, with a critic's and LoRA's terms
  (``sim.trained``: LoRA drops the frozen weights' weight-gradient GEMMs, a separate critic adds its own
  passes and optimizer step);
- the KV that fits = memory · utilisation − weights / g, per GPU, over the KV bytes of a token
  (``shape.kv_bytes_per_token``: layers · 2 · KV heads · head dim · bytes); with paged KV it is the engine's
  budget that running contexts fill as they grow (preempting the newest when full), with reserved KV the pool
  that longest-context reservations fill, in min(``cost.max_num_seqs``, that KV // one reservation) slots
  (``reserved_slots``: the built-in engine preallocates each slot at the longest context);
- a weight update moves the served weights (LoRA: the adapter pairs) over each GPU's network link, plus a
  fixed reload time (and, on the built-in engine, merging an adapter into the served weights).

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
from asyncrl.config.run import load_run_config
from asyncrl.config.sim import SimConfig
from asyncrl.sim import trained
from asyncrl.sim.hardware import HardwareProfile, resolve_profile
from asyncrl.sim.model_shape import ModelShape, resolve_shape
from asyncrl.sim.run_engine import with_run_engine
from asyncrl.sim.trained import TrainedParts, trained_parts
from asyncrl.sim.workload import LengthModel

LENGTH_SAMPLES = 4000
"""Responses drawn from the length model to take its moments (deterministic per seed)."""


def load_sim_config(path: str | None, overrides: Sequence[str] = ()) -> SimConfig:
    """The YAML file plus overrides as a ``SimConfig``; with ``model`` and ``hardware`` set, the engine of the
    training config ``memory.train_config`` names where it names one (``sim.run_engine``), and every engine and
    trainer cost key the file and overrides leave unset derived (``derived_keys``)."""
    data = read_yaml_file(path) if path is not None else {}
    data = apply_overrides(SimConfig, data, overrides)
    config = from_dict(SimConfig, data)
    if not config.model:
        return config
    if config.memory.train_config:
        run = load_run_config(config.memory.train_config)
        data = with_run_engine(data, run.engine, f"memory.train_config {config.memory.train_config}")
        config = from_dict(SimConfig, data)
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
    parts = trained_parts(config)
    decode_s = decode_read_bytes(config, shape) / (profile.hbm_bandwidth * eff.decode_weights)
    per_request_s = (
        2 * decode_params_per_token(config, shape, parts) / (profile.peak_flops * eff.decode_compute)
    )
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
        reservation = reserved_tokens(config)
        if reservation > kv_tokens:
            raise ValueError(
                f"cost.kv=reserved: one request's longest context ({reservation} tokens) exceeds the KV that "
                f"fits an engine ({kv_tokens} tokens)"
            )
        running, max_kv = reserved_slots(config.cost.max_num_seqs, kv_tokens, reservation), kv_tokens
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
        "weight_update_s": _weight_transfer_s(config, shape, profile, parts)
        + adapter_merge_s(config, shape, profile, parts.lora_rank)
        + config.cost.weight_reload_s,
    }


def reserved_tokens(config: SimConfig) -> int:
    """What one request reserves on the built-in engine: its longest context, prompt + max_new_tokens, capped
    by ``engine.max_model_len`` where set (``engine.admission``'s rule)."""
    longest = config.prompt_tokens + config.rollout.max_new_tokens
    cap = config.engine.max_model_len
    return longest if cap is None else min(longest, cap)


def reserved_slots(max_num_seqs: int, kv_tokens: int, reservation: int) -> int:
    """The built-in engine's slots (``cost.kv: reserved``): ``cost.max_num_seqs``, but no more than the KV that
    fits holds at once, ``kv_tokens // reservation``. Why not all ``max_num_seqs``: admission never runs more
    than that many (every request reserves its longest context), while the engine preallocates every slot at
    that length, so the slots beyond it would be memory the plan must find and no request uses: the memory
    check plans, and the run config it stands for sets, exactly these slots."""
    return max(1, min(max_num_seqs, kv_tokens // reservation))


def decode_params_per_token(config: SimConfig, shape: ModelShape, parts: TrainedParts) -> int:
    """Weights a decoded token multiplies: the model's, plus its LoRA adapters where the engine serves them
    unmerged (``cost.kv: paged``, vLLM's LoRA); the built-in engine merges them (``adapter_merge_s``)."""
    unmerged = parts.lora_rank if config.cost.kv == "paged" else 0
    return shape.active_params_per_token + shape.active_lora_params(unmerged)


def adapter_merge_s(config: SimConfig, shape: ModelShape, profile: HardwareProfile, lora_rank: int) -> float:
    """The built-in engine's (``cost.kv: reserved``) merge of a LoRA update, per accelerator: W = W0 + B·A·s on
    every adapted linear reads W0 and writes W (two passes of those weights at HBM bandwidth) and costs 2·rank
    FLOPs per adapted weight; the slower bound. 0 without LoRA and for vLLM (paged), which serves the adapter
    unmerged (``decode_params_per_token``)."""
    if not lora_rank or config.cost.kv == "paged":
        return 0.0
    adapted = (shape.num_params - shape.embedding_params) / config.engine.gpus_per_engine
    memory_s = (
        2 * adapted * config.cost.bytes_per_param / (profile.hbm_bandwidth * profile.efficiency.decode_kv)
    )
    compute_s = 2 * lora_rank * adapted / (profile.peak_flops * profile.efficiency.prefill)
    return max(memory_s, compute_s)


def published_bytes(config: SimConfig, shape: ModelShape, lora_rank: int) -> float:
    """One version's bytes a weight update ships, in the served dtype: the adapter pairs with LoRA."""
    return trained.published_params(shape, lora_rank) * config.cost.bytes_per_param


def _weight_transfer_s(
    config: SimConfig, shape: ModelShape, profile: HardwareProfile, parts: TrainedParts
) -> float:
    """Moving one version's published weights to an engine: over the network link, or colocated on the device
    itself (``colocated_switch_parts``' ``sync``)."""
    if config.trainer.colocated:
        return colocated_switch_parts(config, shape, profile)["sync"]
    return published_bytes(config, shape, parts.lora_rank) / profile.inter_node_bandwidth


def colocated_switch_parts(
    config: SimConfig, shape: ModelShape, profile: HardwareProfile
) -> dict[str, float]:
    """Seconds of each part of one step's colocated switch (``runtime.switch``), per accelerator, from the
    bytes it moves and the bandwidth they move at (docs/simulator.md):

    - ``offload``: the trainer's state (``cost.switch_offload_bytes_per_param`` per parameter, sharded over
      the trainer's accelerators; with LoRA and a critic as ``trained.offloaded_state_bytes`` counts it) to
      host memory and back: twice over the host link;
    - ``engine_weights``: at ``cost.switch_sleep_level`` 2, an engine's served weights (its share per
      accelerator) to host memory and back: twice over the host link; 0 at level 1;
    - ``kv``: the freed KV pool allocated and zeroed again on wake: one write of it at HBM bandwidth;
    - ``sync``: the weights by CUDA IPC: the trainer packs a served-dtype copy (one write), the engine reads
      it and writes its own (one read, one write): three passes of the published weights (LoRA: the
      adapters) at HBM bandwidth;
    - ``fixed``: ``cost.switch_fixed_s``.
    """
    cost, engine_gpus = config.cost, config.engine.gpus_per_engine
    host, hbm = profile.host_link_bandwidth, profile.hbm_bandwidth * profile.efficiency.decode_kv
    served = weight_bytes(config, shape) / engine_gpus
    kv_pool = profile.hbm_bytes * cost.memory_utilization - served
    parts = trained_parts(config)
    state = trained.offloaded_state_bytes(shape, parts, cost.switch_offload_bytes_per_param)
    return {
        "offload": 2 * state / config.num_train_gpus / host,
        "engine_weights": 2 * served / host if cost.switch_sleep_level == 2 else 0.0,
        "kv": max(kv_pool, 0.0) / hbm,
        "sync": 3 * (published_bytes(config, shape, parts.lora_rank) / engine_gpus) / hbm,
        "fixed": cost.switch_fixed_s,
    }


def trainer_keys(config: SimConfig, shape: ModelShape, profile: HardwareProfile) -> dict[str, Any]:
    eff = profile.efficiency
    parts = trained_parts(config)
    context = mean_attention_context(config)
    critic_train, critic_no_grad = trained.critic_flops(
        shape, context, parts.critic, parts.critic_body(shape)
    )
    train = trained.policy_train_flops(shape, context, parts.lora_rank) + critic_train
    passes = trained.no_grad_passes(config.cost.logprob_passes, parts.critic)
    no_grad = passes * trained.no_grad_pass_flops(shape, context, parts.lora_rank) + critic_no_grad
    per_token = train / (profile.peak_flops * eff.train) + no_grad / (profile.peak_flops * eff.logprob)
    gpus = config.num_train_gpus
    optimizer_s = trained.optimizer_bytes(shape, parts) / (profile.hbm_bandwidth * eff.decode_kv * gpus)
    switch_s = 0.0
    if config.trainer.colocated:  # the switch between rollout and training; its weight copy is the update's
        switch = colocated_switch_parts(config, shape, profile)
        switch_s = sum(seconds for part, seconds in switch.items() if part != "sync")
    return {"gpu_s_per_token": per_token, "step_overhead_s": optimizer_s + switch_s}
