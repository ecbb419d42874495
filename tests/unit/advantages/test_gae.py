"""GAE against an independent implementation written from the formula, not the recursion.

The reference takes each row's model tokens s_0 … s_{n−1} (loss mask 1, env and prompt tokens skipped),
δ_k = r_k + γ·V_{k+1} − V_k with V_n = 0, and sums A_k = Σ_{l≥0} (γλ)^l·δ_{k+l} explicitly; R_k = A_k + V_k.
"""

import random

import pytest
import torch

from asyncrl.trainer.gae import explained_variance, gae, whiten


def reference_gae(rewards, values, mask, gamma, lam):
    advantages = [[0.0] * len(row) for row in rewards]
    returns = [[0.0] * len(row) for row in rewards]
    for b, row_mask in enumerate(mask):
        steps = [t for t, m in enumerate(row_mask) if m]
        v = [values[b][t] for t in steps] + [0.0]
        r = [rewards[b][t] for t in steps]
        deltas = [r[k] + gamma * v[k + 1] - v[k] for k in range(len(steps))]
        for k, t in enumerate(steps):
            a = sum((gamma * lam) ** (j - k) * deltas[j] for j in range(k, len(steps)))
            advantages[b][t] = a
            returns[b][t] = a + v[k]
    return advantages, returns


def random_case(seed, rows=5, width=12):
    rng = random.Random(seed)
    mask = []
    for _ in range(rows):
        row, t = [0] * width, rng.randint(0, 3)  # a prompt, then turns of model tokens and env tokens
        while t < width and rng.random() < 0.9:
            for _ in range(rng.randint(1, 4)):
                if t < width:
                    row[t], t = 1, t + 1
            t += rng.randint(0, 3)
        mask.append(row)
    mask[-1] = [0] * width  # a row without model tokens
    rewards = [[rng.uniform(-1, 1) if m and rng.random() < 0.4 else 0.0 for m in row] for row in mask]
    values = [[rng.uniform(-2, 2) for _ in row] for row in mask]
    return rewards, values, mask


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8), (0.99, 0.0), (0.5, 1.0)])
def test_gae_matches_the_explicit_sum(seed, gamma, lam):
    rewards, values, mask = random_case(seed)
    advantages, returns = gae(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(mask, dtype=torch.float64),
        gamma,
        lam,
    )
    want_advantages, want_returns = reference_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(
        advantages, torch.tensor(want_advantages, dtype=torch.float64), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(returns, torch.tensor(want_returns, dtype=torch.float64), atol=1e-12, rtol=0)


def test_lambda_one_gamma_one_is_return_to_go_minus_value():
    """A 3-token response with reward 1 on its last token: A_t = 1 − V_t, R_t = 1, whatever the values."""
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.25, -0.5, 0.75]])
    advantages, returns = gae(rewards, values, mask, 1.0, 1.0)
    assert advantages.tolist() == [[0.0, 0.75, 1.5, 0.25]]
    assert returns.tolist() == [[0.0, 1.0, 1.0, 1.0]]


def test_env_tokens_between_turns_are_not_steps():
    """Turn rewards 1 and 2 with an observation between: the first turn's last token sees V of the second
    turn's first token, and the observation's own value is never read."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.5, 100.0, 100.0, 0.5]])
    advantages, _ = gae(rewards, values, mask, 0.5, 1.0)
    # δ = [0 + .5·.5 − .5, 1 + .5·.5 − .5, 2 − .5] = [−.25, .75, 1.5]; A = [−.25 + .5·.75 + .25·1.5, .75 + .75, 1.5]
    assert advantages[0].tolist() == pytest.approx([0.5, 1.5, 0.0, 0.0, 1.5])


def test_whiten_uses_only_counted_tokens():
    values = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = whiten(values, mask, eps=0.0)
    assert out[0].tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0])


def test_explained_variance_of_a_perfect_and_a_constant_critic():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones_like(returns)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)


def per_position_recursion(token_rewards, values, loss_mask, gamma, lam):
    """The recursion as it ran on the tensors' device before (one small op per position and quantity)."""
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    for t in reversed(range(values.shape[1])):
        step = loss_mask[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(step, advantage, 0.0)
        next_value = torch.where(step, values[:, t], next_value)
        next_advantage = torch.where(step, advantage, next_advantage)
    return advantages, (advantages + values) * loss_mask


def test_long_float32_rows_equal_the_per_position_recursion_to_the_bit():
    """T = 6,000 in float32 (multi-turn masks with gaps, a row without steps): the host computation does the
    recursion's arithmetic in the same order, so nothing may differ, not even in the last bit."""
    generator = torch.Generator().manual_seed(0)
    rows, width = 6, 6000
    loss_mask = (torch.rand(rows, width, generator=generator) < 0.7).float()
    loss_mask[:, :50] = 0.0  # a prompt
    loss_mask[-1] = 0.0
    token_rewards = (
        torch.randn(rows, width, generator=generator)
        * (torch.rand(rows, width, generator=generator) < 0.01)
        * loss_mask
    )
    values = torch.randn(rows, width, generator=generator)
    advantages, returns = gae(token_rewards, values, loss_mask, 0.99, 0.95)
    want_advantages, want_returns = per_position_recursion(token_rewards, values, loss_mask, 0.99, 0.95)
    assert advantages.dtype == torch.float32 and advantages.device == values.device
    assert torch.equal(advantages, want_advantages) and torch.equal(returns, want_returns)
