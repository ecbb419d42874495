import math

import pytest
import torch

from asyncrl.trainer.kl import kl_estimate


@pytest.mark.parametrize(
    ("estimator", "value", "gradient"),
    [
        ("k1", 0.5, 1.0),
        ("k2", 0.125, 0.5),
        ("k3", math.exp(-0.5) - 1 + 0.5, 1 - math.exp(-0.5)),
    ],
)
def test_kl_estimators_exact_values_and_gradients(estimator, value, gradient):
    logprobs = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    ref_logprobs = torch.tensor([-1.5], dtype=torch.float64)  # log π_ref/π_θ = -0.5
    kl = kl_estimate(logprobs, ref_logprobs, estimator)
    kl.sum().backward()
    assert kl.item() == pytest.approx(value)
    assert float(logprobs.grad) == pytest.approx(gradient)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_vanish_when_policies_agree(estimator):
    logprobs = torch.tensor([-0.3, -2.0])
    assert torch.equal(kl_estimate(logprobs, logprobs.clone(), estimator), torch.zeros(2))


def test_kl_k3_stays_finite_for_huge_log_ratio():
    assert torch.isfinite(kl_estimate(torch.tensor([-500.0]), torch.tensor([0.0]), "k3")).all()


def test_kl_rejects_unknown_estimator():
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")
