"""The trainer on CUDA computes what it computes on CPU: one step's loss, gradient and update direction, and a
bfloat16 step close to the float32 one. Skipped without a CUDA device; ``scripts/gpu-smoke.sh`` runs them."""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _step(device: str, **config) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One train step from the same weights and groups: its metrics and each parameter's change (on CPU)."""
    groups = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)
    model = tiny_qwen2().to(device)
    before = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    trainer = Trainer(
        model,
        TrainerConfig(**{"lr": 1e-3, "max_tokens_per_microbatch": 30, **config}),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
    )
    metrics = trainer.train_step(groups, policy_version=0)
    return metrics, {name: p.detach().cpu() - before[name] for name, p in model.named_parameters()}


def _cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Cosine of two updates over all parameters: Adam's first step is sign-like, so a few near-zero gradient
    entries may flip sign between devices; the direction as a whole must not change."""
    flat_a = torch.cat([t.flatten() for t in a.values()]).double()
    flat_b = torch.cat([b[name].flatten() for name in a]).double()
    return float(flat_a @ flat_b / (flat_a.norm() * flat_b.norm()))


def test_a_train_step_on_cuda_matches_cpu() -> None:
    cpu_metrics, cpu_update = _step("cpu")
    cuda_metrics, cuda_update = _step("cuda")
    assert cuda_metrics["loss"] == pytest.approx(cpu_metrics["loss"], abs=1e-5)
    assert cuda_metrics["grad_norm"] == pytest.approx(cpu_metrics["grad_norm"], rel=1e-4)
    assert cuda_metrics["entropy"] == pytest.approx(cpu_metrics["entropy"], rel=1e-4)
    assert _cosine(cuda_update, cpu_update) > 0.999


def test_a_bfloat16_step_on_cuda_stays_close_to_float32() -> None:
    fp32_metrics, fp32_update = _step("cuda")
    bf16_metrics, bf16_update = _step("cuda", compute_dtype="bfloat16")
    assert bf16_metrics["loss"] == pytest.approx(fp32_metrics["loss"], abs=2e-2)
    assert bf16_metrics["grad_norm"] == pytest.approx(fp32_metrics["grad_norm"], rel=5e-2)
    assert _cosine(bf16_update, fp32_update) > 0.9
