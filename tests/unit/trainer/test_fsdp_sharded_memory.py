"""The sharded trainer's memory at four FSDP2 ranks over gloo, on a 105 M-parameter model: each rank loads only its
shards, and accumulates only its shard of the gradient; the step it then takes equals one process's.

Bytes are allocated bytes, not RSS (``asyncrl.testing.allocated``): torch's CPU allocator's while loading, the
heap's in use (every thread's frees counted: gloo's threads free the collectives' buffers) between passes.
- Loading: a rank's peak while building its trainer from the model directory (meta skeleton, ``fully_shard``,
  its rows read from the safetensors files) is at most 0.35x one process's peak while loading the model whole
  (a quarter, plus one tensor's rows in flight). The weights after one step then equal the one-process
  step's, as ``test_trainer_fsdp`` requires, so the shards were filled with the right rows.
- Accumulation: each rank trains two micro-batches of one mini-batch; what the first pass leaves held when the
  second begins is the accumulated gradient (its activations are freed by then). With
  ``fsdp_grad_accumulation: sharded`` that is at most 0.35x what ``unsharded`` holds: a quarter, plus at most
  one layer's reduce-scatter input (1/16 here), which FSDP2 may keep until its next reduction. The unsharded
  run must hold at least the full fp32 gradient, so the comparison can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed
from trainer_fixtures import random_groups

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import (
    load_configured_model,
    load_configured_skeleton,
    load_tokenizer,
    save_tiny,
)
from asyncrl.models.tiny import build_tiny_model
from asyncrl.testing.allocated import AllocatedBytes, heap_bytes_in_use
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer

WIDE = {"hidden_size": 640, "num_layers": 16, "num_heads": 10, "vocab_size": 512}
"""A tiny-vocabulary, wide Qwen2 with tied embeddings: 105 M parameters, nearly all in the 16 decoder layers."""
WORLD = 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """(its directory, its parameter count)."""
    model = build_tiny_model(**WIDE)
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters >= 100_000_000
    return str(save_tiny(model, load_tokenizer(""), tmp_path_factory.mktemp("wide"))), parameters


def _trainer(model: torch.nn.Module, parallel: Parallelism, **overrides: object) -> Trainer:
    config = TrainerConfig(lr=1e-4, max_grad_norm=None, **overrides)
    return Trainer(model, config, LossConfig(name="ppo"), AdvantageConfig(name="grpo"), parallel=parallel)


def _groups():
    return random_groups(num_groups=2, group_size=4, seed=4)


def _full_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
        for name, p in trainer.model.named_parameters()
    }


def _sharded_load_and_step(path: str) -> tuple[int, dict[str, torch.Tensor] | None]:
    """(peak bytes while this rank builds its trainer from ``path``, full weights after one step on rank 0)."""
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    config = ModelConfig(path=path)
    with AllocatedBytes() as trace:
        model, _ = load_configured_skeleton(config)
        trainer = _trainer(model, FullyShardedParallel("cpu", weights=Path(path)))
    trainer.train_step(_groups(), policy_version=0)
    weights = _full_weights(trainer)
    return trace.peak, weights if trainer.parallel.rank == 0 else None


def test_each_rank_loads_only_its_shards_and_steps_as_one_process(wide_model: tuple[str, int]):
    model_path, parameters = wide_model
    ranks = run_ranks(_sharded_load_and_step, WORLD, model_path)
    with AllocatedBytes() as trace:
        model, _ = load_configured_model(ModelConfig(path=model_path))
    whole = trace.peak
    trainer = _trainer(model, SingleProcess())
    trainer.train_step(_groups(), policy_version=0)
    want = _full_weights(trainer)
    assert whole >= 4 * parameters  # the whole fp32 model: the check can fail
    for rank, (peak, _) in enumerate(ranks):
        assert peak <= 0.35 * whole, f"rank {rank} peaked at {peak} B while loading, one process at {whole} B"
    got = ranks[0][1]
    assert got.keys() == want.keys()
    error = sum(float((got[n] - w).pow(2).sum()) for n, w in want.items()) ** 0.5
    norm = sum(float(w.pow(2).sum()) for w in want.values()) ** 0.5
    assert error / norm <= 1e-5, f"weights after the sharded step: relative error {error / norm:.2e}"


def _accumulated_gradient_bytes(path: str, grad_accumulation: str) -> int:
    """Heap bytes in use when the second of two passes begins, beyond those at the first."""
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    class Marked(FullyShardedParallel):
        """Reads the heap as every pass begins (the trainer asks before each backward)."""

        levels: list[int] = []

        def sync_gradients(self, module, last):  # noqa: ANN001, ANN202
            # FSDP2's stream events are no-ops on CPU, so gloo's asynchronous reduce-scatters may still hold
            # their layer-sized inputs here; the barrier waits for them as a stream sync would on GPU.
            torch.distributed.barrier()
            self.levels.append(heap_bytes_in_use())
            super().sync_gradients(module, last)

    model, _ = load_configured_skeleton(ModelConfig(path=path))
    parallel = Marked("cpu", grad_accumulation=grad_accumulation, weights=Path(path))
    # One sample per micro-batch: 8 samples over 4 ranks are two passes each.
    trainer = _trainer(model, parallel, max_tokens_per_microbatch=1, sequence_packing=False)
    trainer.train_step(_groups(), policy_version=0)
    first, second = parallel.levels
    return second - first


def test_sharded_accumulation_holds_a_quarter_of_the_unsharded_gradient(wide_model: tuple[str, int]):
    model_path, parameters = wide_model
    sharded = run_ranks(_accumulated_gradient_bytes, WORLD, model_path, "sharded")
    unsharded = run_ranks(_accumulated_gradient_bytes, WORLD, model_path, "unsharded")
    for rank, (held, full) in enumerate(zip(sharded, unsharded, strict=True)):
        assert full >= 4 * parameters, f"rank {rank}: unsharded run held {full} B, not the fp32 gradient"
        assert held <= 0.35 * full, f"rank {rank}: sharded accumulation held {held} B against {full} B"
