"""Sharded loading with LoRA and a critic: each FSDP2 rank builds the model on the meta device and reads only its
shards, while what the run adds (LoRA adapters drawn from the seed, a critic's zero value head; a separate
critic's body is the policy's, read from the same files) is built for real and kept over the allocation.

- Two gloo ranks, a tiny Qwen2, LoRA and a separate critic (default suite; slow: three ranks, uneven shards,
  also LoRA alone and a shared-trunk critic): the adapters each rank holds before the step are the one-process
  adapters, and the weights after one step (policy with its adapters, the critic) equal the one-process
  step's, as ``test_trainer_fsdp`` requires.
- Slow (four ranks, 105 M parameters, LoRA and a separate critic): each rank's peak allocated bytes while building
  its trainer is at most 0.35x one process's building the same trainer from the whole model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_fixtures import random_groups

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.critic import CriticConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.models.loading import load_configured_model, load_configured_skeleton, load_tokenizer, save_tiny
from asyncrl.models.tiny import build_tiny_model
from asyncrl.testing.allocated import AllocatedBytes
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.lora import adapter_tensors
from asyncrl.trainer.trainer import Trainer

CASES = {
    "lora+separate": {"lora": True, "critic": "separate"},
    "lora": {"lora": True, "critic": None},
    "shared_trunk": {"lora": False, "critic": "shared_trunk"},
}
"""Case name -> what the run adds to the model: LoRA adapters, and which critic."""


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    model = build_tiny_model(hidden_size=96, num_heads=4, num_kv_heads=2, num_layers=2, vocab_size=301)
    return str(save_tiny(model, load_tokenizer(""), tmp_path_factory.mktemp("tiny")))


def _trainer(model: torch.nn.Module, parallel: Parallelism, case: str) -> Trainer:
    spec = CASES[case]
    config = TrainerConfig(
        lr=1e-3, max_grad_norm=None, lora=LoraConfig(rank=4) if spec["lora"] else None, seed=3
    )
    critic = CriticConfig(type=spec["critic"]) if spec["critic"] else None
    advantage = AdvantageConfig(name="gae" if critic else "grpo")
    return Trainer(model, config, LossConfig(name="ppo"), advantage, parallel=parallel, critic=critic)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every weight the step trains or reads, gathered (a collective: every rank calls it)."""
    named = [(f"policy.{n}", p) for n, p in trainer.model.named_parameters()]
    if trainer.critic is not None and not trainer.critic.shared:
        named += [(f"critic.{n}", p) for n, p in trainer.critic.module.named_parameters()]
    elif trainer.critic is not None:
        named += [(f"head.{n}", p) for n, p in trainer.critic.module.named_parameters()]
    return {name: _full(p) for name, p in named}


def _run(trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(adapters before the step, every weight after one step)."""
    adapters = {name: _full(t) for name, t in adapter_tensors(trainer.model).items()}
    if trainer.critic is not None:  # a non-zero head, so the critic's body (or the trunk) moves
        for param in trainer.critic.module.parameters():
            if param.ndim == 2 and param.shape[0] == 1:
                with torch.no_grad():
                    param.copy_(_seeded_like(param))
    trainer.train_step(random_groups(num_groups=2, group_size=4, seed=2), policy_version=0)
    return adapters, _state(trainer)


def _seeded_like(param: torch.Tensor) -> torch.Tensor:
    full = torch.randn(tuple(param.shape), generator=torch.Generator().manual_seed(0)) * 0.1
    if hasattr(param, "full_tensor"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, param.device_mesh, param.placements)
    return full


def _sharded(path: str, cases: list[str]) -> list | None:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    results = []
    for case in cases:
        model, _ = load_configured_skeleton(ModelConfig(path=path))
        trainer = _trainer(model, FullyShardedParallel("cpu", weights=Path(path)), case)
        assert not any(p.is_meta for p in trainer.model.parameters())
        results.append(_run(trainer))
    return results if torch.distributed.get_rank() == 0 else None


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    error = sum(float((got[n] - w).pow(2).sum()) for n, w in want.items()) ** 0.5
    norm = sum(float(w.pow(2).sum()) for w in want.values()) ** 0.5
    assert error / norm <= 1e-5, f"weights after the sharded step: relative error {error / norm:.2e}"


def _check(ranks: int, path: str, cases: list[str]) -> None:
    results = run_ranks(_sharded, ranks, path, cases)[0]
    for case, (adapters, weights) in zip(cases, results, strict=True):
        model, _ = load_configured_model(ModelConfig(path=path, device="cpu"))
        want_adapters, want_weights = _run(_trainer(model, SingleProcess(), case))
        assert adapters.keys() == want_adapters.keys() and (not CASES[case]["lora"] or adapters), case
        for name, tensor in want_adapters.items():
            assert torch.equal(adapters[name], tensor), f"{case}: adapter {name} drawn differently"
        _assert_close(weights, want_weights)


def test_a_lora_run_with_a_separate_critic_loads_its_shards_and_steps_as_one_process(tiny_dir: str) -> None:
    _check(2, tiny_dir, ["lora+separate"])


@pytest.mark.slow
def test_every_case_on_three_ranks_of_uneven_shards(tiny_dir: str) -> None:
    _check(3, tiny_dir, list(CASES))


WIDE = {"hidden_size": 640, "num_layers": 16, "num_heads": 10, "vocab_size": 512}
"""As ``test_fsdp_sharded_memory``: a wide tiny-vocabulary Qwen2 of 105 M parameters."""


def _build_peak(path: str) -> int:
    """Peak allocated bytes while this rank builds its LoRA + separate-critic trainer from ``path``."""
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    with AllocatedBytes() as trace:
        model, _ = load_configured_skeleton(ModelConfig(path=path))
        _trainer(model, FullyShardedParallel("cpu", weights=Path(path)), "lora+separate")
    return trace.peak


@pytest.mark.slow
def test_a_rank_of_a_lora_and_critic_run_loads_a_quarter(tmp_path: Path) -> None:
    model = build_tiny_model(**WIDE)
    parameters = sum(p.numel() for p in model.parameters())
    path = str(save_tiny(model, load_tokenizer(""), tmp_path / "wide"))
    del model
    peaks = run_ranks(_build_peak, 4, path)
    with AllocatedBytes() as trace:
        whole, _ = load_configured_model(ModelConfig(path=path, device="cpu"))
        _trainer(whole, SingleProcess(), "lora+separate")
    single = trace.peak
    assert single >= 8 * parameters  # the policy and the critic's copy of its body, fp32: the check can fail
    for rank, peak in enumerate(peaks):
        assert peak <= 0.35 * single, (
            f"rank {rank} peaked at {peak} B building its trainer, one process {single} B"
        )
