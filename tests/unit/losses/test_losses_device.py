"""The losses, mismatch correction and advantages run on an accelerator and agree with the CPU."""

import pytest
import torch

from asyncrl.config.algorithm import AdvantageConfig, DecoupledPPOParams, KLConfig, LossConfig, MismatchConfig
from asyncrl.trainer.advantages import compute_advantages
from asyncrl.trainer.losses import PolicyLossInputs, compute_policy_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CONFIGS = [
    LossConfig(name="ppo"),
    LossConfig(name="grpo", kl=KLConfig(beta=0.1)),
    LossConfig(name="decoupled_ppo", mismatch=MismatchConfig(granularity="sequence", mode="mask")),
    LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="loglinear")),
    LossConfig(name="tis", mismatch=MismatchConfig(granularity="geometric")),
    LossConfig(name="cispo"),
    LossConfig(name="topr"),
    LossConfig(name="reinforce", mismatch=MismatchConfig()),
]


def random_inputs(device: str) -> PolicyLossInputs:
    generator = torch.Generator().manual_seed(0)

    def noise(scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(4, 6, generator=generator, dtype=torch.float64) * scale).to(device)

    logprobs = -noise().abs()
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[:, 4:] = 0
    return PolicyLossInputs(
        logprobs=logprobs.requires_grad_(True),
        behaviour_logprobs=logprobs.detach() + noise(0.3),
        advantages=noise(),
        loss_mask=mask.to(device),
        proximal_logprobs=logprobs.detach() + noise(0.1),
        ref_logprobs=logprobs.detach() + noise(0.1),
        train_behaviour_logprobs=logprobs.detach() + noise(0.1),
        token_versions=torch.tensor([[3] * 6, [2] * 6, [3] * 6, [1] * 6], device=device),
        current_version=3,
        sequence_rewards=torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64, device=device),
    )


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_loss_on_cuda_matches_cpu(config):
    results = {}
    for device in ("cpu", "cuda"):
        inputs = random_inputs(device)
        loss, metrics = compute_policy_loss(config.name, inputs, config)
        loss.backward()
        results[device] = (loss.item(), inputs.logprobs.grad.cpu(), metrics)
    assert results["cuda"][0] == pytest.approx(results["cpu"][0])
    assert torch.allclose(results["cuda"][1], results["cpu"][1])
    assert results["cuda"][2] == pytest.approx(results["cpu"][2])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_advantages_on_cuda_match_cpu(name):
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 3.0, 2.0]), torch.tensor([0, 0, 0, 1, 2])
    config = AdvantageConfig(name=name)
    on_cuda = compute_advantages(name, rewards.cuda(), groups.cuda(), config).cpu()
    assert torch.allclose(on_cuda, compute_advantages(name, rewards, groups, config))
