"""What a run's roles hold in memory, from the model's shape and the config alone (``asyncrl doctor``).

Key decision: estimates from arithmetic a user can redo, each naming what it counts and what it leaves out
(activations, allocator slack, CUDA context), rather than a measurement that needs the run to start: the point
is to refuse an impossible run before it loads tens of GiB.

- trainer rank: weights, gradients and AdamW's two moments, all in ``model.dtype`` (4 × weights), sharded over
  ``trainer.num_workers`` FSDP ranks, plus a frozen reference copy when the loss needs one;
- built-in engine: its own weights plus the preallocated KV pool, ``engine.max_running_requests`` slots of
  ``max_len + 1`` positions (``engine.kv_cache.pool_bytes``);
- vLLM engine: weights (over ``tensor_parallel_size`` GPUs) inside ``gpu_memory_utilization`` of the device;
- checkpoint: weights plus the optimizer state (``trainer_state.pt``), kept ``keep_last_checkpoints`` times
  plus the one being written.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.run import RunConfig
from asyncrl.sim.model_shape import ModelShape

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TRAINER_COPIES = 4
"""Weights, gradients and AdamW's exp_avg and exp_avg_sq, each the size of the weights."""
KV_POOL_SHARE = 0.9
"""The share of free device memory the built-in engine lets its KV pool take (``llm_engine``'s check)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes each role needs, per device it runs on."""

    weights: int
    """One copy of the weights in ``model.dtype``."""
    trainer_per_rank: int
    engine_weights: int
    """One engine's weights on each of its devices."""
    kv_per_slot: int
    """Built-in engine: one request slot's keys and values over the run's longest context."""
    num_slots: int
    checkpoint: int
    """One checkpoint on disk."""
    num_checkpoints_on_disk: int

    @property
    def engine_total(self) -> int:
        """A built-in engine's weights and whole KV pool."""
        return self.engine_weights + self.kv_per_slot * self.num_slots


def memory_plan(config: RunConfig, shape: ModelShape, max_len: int) -> MemoryPlan:
    """The plan of ``config`` for a model of ``shape`` whose requests reach ``max_len`` positions."""
    element = DTYPE_BYTES[config.model.dtype]
    weights = shape.num_params * element
    workers = config.trainer.num_workers
    reference = weights if config.loss.needs_reference else 0
    tensor_parallel = config.engine.vllm.tensor_parallel_size if config.engine.backend == "vllm" else 1
    keep = config.trainer.keep_last_checkpoints
    every = config.trainer.checkpoint_every
    num_saved = (config.controller.num_steps // every if every else 0) + 1  # the periodic ones and the final
    return MemoryPlan(
        weights=weights,
        trainer_per_rank=-(-(TRAINER_COPIES * weights + reference) // workers),
        engine_weights=-(-weights // tensor_parallel),
        kv_per_slot=shape.kv_bytes_per_token(element) * (max_len + 1),
        num_slots=config.engine.max_running_requests,
        checkpoint=3 * weights,
        num_checkpoints_on_disk=min(keep + 1, num_saved) if keep is not None else num_saved,
    )


def kv_slots_that_fit(free_bytes: int, engine_weights: int, kv_per_slot: int) -> int:
    """Request slots of ``kv_per_slot`` a built-in engine can preallocate in ``free_bytes`` after its weights."""
    if kv_per_slot <= 0:
        return 0
    return max(0, int((free_bytes - engine_weights) * KV_POOL_SHARE) // kv_per_slot)
