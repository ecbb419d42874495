import statistics

import pytest
import torch

from asyncrl.config.algorithm import ADVANTAGE_NAMES, AdvantageConfig
from asyncrl.trainer.advantages import ADVANTAGE_REGISTRY, compute_advantages

# group 0: rewards 1, 0, 1, 1 (mean 0.75, unbiased std 0.5); group 1: one sample; group 2: zero variance
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0, 2.0, 2.0])
GROUPS = torch.tensor([0, 0, 0, 0, 7, 3, 3])
CENTRED = [0.25, -0.75, 0.25, 0.25, 0.0, 0.0, 0.0]


def advantages(name, **kwargs):
    return compute_advantages(name, REWARDS, GROUPS, AdvantageConfig(name=name, **kwargs)).tolist()


def test_literal_and_registry_agree():
    """Every per-sample estimator is registered; GAE, which needs the critic's values, is the trainer's."""
    assert set(ADVANTAGE_NAMES) == set(ADVANTAGE_REGISTRY) | {"gae"}


def test_grpo_normalises_within_groups_and_zeroes_singletons_and_ties():
    eps = 1e-6
    expected = [
        0.25 / (0.5 + eps),
        -0.75 / (0.5 + eps),
        0.25 / (0.5 + eps),
        0.25 / (0.5 + eps),
        0.0,
        0.0,
        0.0,
    ]
    assert advantages("grpo") == pytest.approx(expected)


def test_grpo_eps_is_configurable():
    assert advantages("grpo", eps=0.5)[0] == pytest.approx(0.25)


def test_dr_grpo_only_subtracts_the_group_mean():
    assert advantages("dr_grpo") == pytest.approx(CENTRED)


def test_reinforce_pp_normalises_over_the_batch():
    values = REWARDS.tolist()
    mean, std = statistics.mean(values), statistics.stdev(values)
    assert advantages("reinforce_pp") == pytest.approx([(v - mean) / (std + 1e-6) for v in values])


def test_reinforce_pp_baseline_centres_by_group_then_scales_by_batch_std():
    std = statistics.stdev(CENTRED)
    assert advantages("reinforce_pp_baseline") == pytest.approx([c / (std + 1e-6) for c in CENTRED])


def test_single_sample_batch_gives_zero_advantage():
    for name in ADVANTAGE_REGISTRY:
        result = compute_advantages(name, torch.tensor([3.0]), torch.tensor([0]), AdvantageConfig(name=name))
        assert result.tolist() == [0.0]


def test_config_and_inputs_are_validated():
    with pytest.raises(ValueError, match="advantage.name must be one of 'grpo', 'dr_grpo'"):
        AdvantageConfig(name="vtrace")
    with pytest.raises(ValueError, match="advantage.eps applies only to"):
        AdvantageConfig(name="dr_grpo", eps=1e-3)
    with pytest.raises(ValueError, match="advantage.eps must be > 0"):
        AdvantageConfig(eps=0.0)
    assert AdvantageConfig().eps == 1e-6
    with pytest.raises(ValueError, match=r"must both be \[B\]"):
        compute_advantages("grpo", REWARDS, GROUPS[:3], AdvantageConfig())
    with pytest.raises(ValueError, match="advantage.name must be one of"):
        compute_advantages("vtrace", REWARDS, GROUPS, AdvantageConfig())
    with pytest.raises(ValueError, match="'gae' needs the critic's values"):
        compute_advantages("gae", REWARDS, GROUPS, AdvantageConfig())
