"""A separate critic whose body is another checkpoint (``critic.model_path``) loads sharded like the policy: on a
sharded trainer (policy on the meta device) ``build_trainer`` builds the critic body as a skeleton too, and each
FSDP2 rank reads only its rows of it from that checkpoint's files.

- Two gloo ranks (default suite; slow: three, uneven shards): the critic body is of another shape and other weights
  than the policy, saved in bfloat16 over several indexed files; the gathered critic (body and value head) equals
  one process's ``build_trainer`` critic exactly, and the weights after one step (policy and critic) equal the
  one-process step's, as ``test_trainer_fsdp`` requires.
- Slow (four ranks, a tiny policy and a 105 M-parameter critic checkpoint, so the critic dominates): each rank's
  peak allocated bytes while building its trainer is at most 0.35x one process's (a quarter, plus one tensor's
  rows in flight). Loading the critic body whole on every rank, as before, peaks above the whole body's bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_fixtures import random_groups

from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.models.loading import (
    load_configured_model,
    load_configured_skeleton,
    load_tokenizer,
    model_dir,
    save_tiny,
)
from asyncrl.models.tiny import build_tiny_model
from asyncrl.testing.allocated import AllocatedBytes
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.factory import build_trainer
from asyncrl.trainer.trainer import Trainer

POLICY = {"hidden_size": 96, "num_heads": 4, "num_kv_heads": 2, "num_layers": 2, "vocab_size": 301}
CRITIC = {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "num_layers": 3, "vocab_size": 301, "seed": 7}
"""Another shape and other weights than the policy's: a critic read from the policy's files would fail or differ."""
WIDE = {"hidden_size": 640, "num_layers": 16, "num_heads": 10, "vocab_size": 512}
"""As ``test_fsdp_sharded_memory``: a wide tiny-vocabulary Qwen2 of 105 M parameters."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(the policy's directory, the critic checkpoint's: bfloat16, several files and an index)."""
    root = tmp_path_factory.mktemp("critic")
    policy = save_tiny(build_tiny_model(**POLICY), load_tokenizer(""), root / "policy")
    critic = build_tiny_model(**CRITIC).to(torch.bfloat16)
    critic.save_pretrained(root / "critic", max_shard_size="100KB")
    assert (root / "critic" / "model.safetensors.index.json").is_file()
    return str(policy), str(root / "critic")


def _config(policy: str, critic: str) -> RunConfig:
    return load_run_config(
        None,
        [
            f"model.path={policy}",
            "model.device=cpu",
            "model.dtype=float32",
            "loss.name=ppo",
            "advantage.name=gae",
            "critic.type=separate",
            f"critic.model_path={critic}",
            "critic.lr=1e-3",
            "trainer.lr=1e-3",
        ],
    )


def _build(config: RunConfig, parallel: Parallelism | None) -> Trainer:
    """The run's trainer: from a skeleton read in shards under ``parallel``, else from the whole model."""
    if parallel is None:
        model, tokenizer = load_configured_model(config.model)
        return build_trainer(config, model.train(), tokenizer, SingleProcess())
    model, tokenizer = load_configured_skeleton(config.model)
    return build_trainer(config, model.train(), tokenizer, parallel)


def _sharded_parallel(config: RunConfig) -> Parallelism:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    return FullyShardedParallel("cpu", weights=model_dir(config.model))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def _critic_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    assert trainer.critic is not None and not trainer.critic.shared
    return {name: _full(p) for name, p in trainer.critic.module.named_parameters()}


def _policy_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: _full(p) for name, p in trainer.model.named_parameters()}


def _load_and_step(trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the critic as loaded, every weight after one step); the value head is set non-zero first, so the
    critic's body moves in the step."""
    loaded = _critic_state(trainer)
    head = trainer.critic.module.head.weight
    full = torch.randn(tuple(head.shape), generator=torch.Generator().manual_seed(0)) * 0.1
    if hasattr(head, "full_tensor"):
        from torch.distributed.tensor import distribute_tensor

        full = distribute_tensor(full, head.device_mesh, head.placements)
    with torch.no_grad():
        head.copy_(full)
    trainer.train_step(random_groups(num_groups=2, group_size=4, seed=2), policy_version=0)
    after = {f"policy.{n}": t for n, t in _policy_state(trainer).items()}
    after |= {f"critic.{n}": t for n, t in _critic_state(trainer).items()}
    return loaded, after


def _sharded(policy: str, critic: str) -> tuple | None:
    config = _config(policy, critic)
    trainer = _build(config, _sharded_parallel(config))
    result = _load_and_step(trainer)
    return result if torch.distributed.get_rank() == 0 else None


def _check(ranks: int, checkpoints: tuple[str, str]) -> None:
    policy, critic = checkpoints
    loaded, after = run_ranks(_sharded, ranks, policy, critic)[0]
    want_loaded, want_after = _load_and_step(_build(_config(policy, critic), None))
    assert loaded["body.embed_tokens.weight"].shape == (CRITIC["vocab_size"], CRITIC["hidden_size"])
    assert loaded.keys() == want_loaded.keys()
    for name, tensor in want_loaded.items():
        assert torch.equal(loaded[name], tensor), f"critic {name}: loaded other values than one process"
    assert after.keys() == want_after.keys()
    error = sum(float((after[n] - w).pow(2).sum()) for n, w in want_after.items()) ** 0.5
    norm = sum(float(w.pow(2).sum()) for w in want_after.values()) ** 0.5
    assert error / norm <= 1e-5, f"weights after the sharded step: relative error {error / norm:.2e}"


def test_two_ranks_read_a_critic_checkpoint_of_their_own_and_step_as_one_process(checkpoints) -> None:
    _check(2, checkpoints)


@pytest.mark.slow
def test_three_ranks_of_uneven_shards(checkpoints) -> None:
    _check(3, checkpoints)


def _build_peak(policy: str, critic: str) -> tuple[int, bool]:
    """(peak allocated bytes while this rank builds its trainer, whether its critic body was a skeleton)."""
    config = _config(policy, critic)
    with AllocatedBytes() as trace:
        trainer = _build(config, _sharded_parallel(config))
    assert trainer.critic is not None
    return trace.peak, not any(p.is_meta for p in trainer.critic.module.parameters())


@pytest.mark.slow
def test_a_rank_loads_a_quarter_of_a_critic_checkpoint(checkpoints, tmp_path: Path) -> None:
    policy, _ = checkpoints
    body = build_tiny_model(**WIDE)
    parameters = sum(p.numel() for p in body.parameters())
    critic = str(save_tiny(body, load_tokenizer(""), tmp_path / "wide"))
    del body
    ranks = run_ranks(_build_peak, 4, policy, critic)
    with AllocatedBytes() as trace:
        _build(_config(policy, critic), None)
    single = trace.peak
    assert single >= 4 * parameters  # the whole fp32 critic body: the check can fail
    for rank, (peak, materialised) in enumerate(ranks):
        assert materialised, f"rank {rank}: the critic kept parameters on the meta device"
        assert peak <= 0.35 * single, (
            f"rank {rank} peaked at {peak} B building its trainer, one process {single} B"
        )
