import pytest
import torch

from asyncrl.trainer.losses import aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "norm_length", "expected"),
    [
        ("token-mean", None, 7 / 3),
        ("seq-mean-token-mean", None, (1.5 + 4.0) / 2),
        ("seq-mean-token-sum", None, (3.0 + 4.0) / 2),
        ("seq-mean-token-sum-norm", None, (3.0 + 4.0) / 2 / 3),
        ("seq-mean-token-sum-norm", 10, (3.0 + 4.0) / 2 / 10),
    ],
)
def test_aggregate_exact_values(mode, norm_length, expected):
    assert float(aggregate(VALUES, MASK, mode, norm_length)) == pytest.approx(expected)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_aggregate_ignores_masked_values_and_gives_them_no_gradient(mode):
    values = VALUES.clone().requires_grad_(True)
    garbage = torch.where(MASK > 0, VALUES, torch.full_like(VALUES, 1e6)).requires_grad_(True)
    loss = aggregate(values, MASK, mode)
    assert aggregate(garbage, MASK, mode).item() == pytest.approx(loss.item())
    loss.backward()
    assert torch.all(values.grad[MASK == 0] == 0)


def test_aggregate_gradients_weigh_tokens_by_mode():
    values = VALUES.clone().requires_grad_(True)
    aggregate(values, MASK, "seq-mean-token-mean").backward()
    # Two non-empty sequences, each weighing 1/2, split over its own tokens.
    assert values.grad.tolist() == [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_aggregate_of_an_empty_mask_is_zero(mode):
    assert float(aggregate(VALUES, torch.zeros_like(MASK), mode)) == 0.0


def test_aggregate_rejects_unknown_mode_naming_valid_ones():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(VALUES, MASK, "sum")
