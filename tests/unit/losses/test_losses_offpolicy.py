"""OPSM, M2PO, K3 rejection and rejection-only mismatch, each against a reference written from its paper's formula.

The references below are plain Python loops over the formulas as published (DeepSeek-V3.2 §3 for OPSM; M2PO's
masking rule, Zheng et al. 2025; K3 = ρ − 1 − log ρ averaged over a sequence, as in verl's K3-RS), sharing no
code with the implementation, and are compared on random inputs over several thresholds and masks.
"""

import math
import random
from dataclasses import replace

import pytest
import torch

from asyncrl.config.algorithm import (
    ClipParams,
    K3RejectionConfig,
    LossConfig,
    M2POConfig,
    MismatchConfig,
    OPSMConfig,
    TISParams,
)
from asyncrl.trainer.losses import PolicyLossInputs, compute_policy_loss
from asyncrl.trainer.mismatch import compute_step_start_correction, k3_rejection_mask
from asyncrl.trainer.offpolicy import m2po_keep, opsm_keep


def _random_case(
    seed: int, rows: int = 6, width: int = 7, spread: float = 0.6
) -> dict[str, list[list[float]]]:
    """Log-probs of three policies, a per-sequence advantage (broadcast) and a right-padded mask, as lists."""
    rng = random.Random(seed)
    lengths = [rng.randint(0, width) for _ in range(rows)]
    mask = [[1.0 if t < n else 0.0 for t in range(width)] for n in lengths]
    current = [[-rng.uniform(0.1, 3.0) for _ in range(width)] for _ in range(rows)]
    behaviour = [[c + rng.gauss(0.0, spread) for c in row] for row in current]
    train = [[b + rng.gauss(0.0, spread / 3) for b in row] for row in behaviour]
    advantages = [[a] * width for a in (rng.uniform(-1.5, 1.5) for _ in range(rows))]
    return {
        "current": current,
        "behaviour": behaviour,
        "train": train,
        "advantages": advantages,
        "mask": mask,
    }


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _counted(row: list[float], mask: list[float]) -> list[float]:
    return [v for v, m in zip(row, mask, strict=True) if m]


# ---- OPSM: M_i = 0 iff Â_i < 0 and (1/|o_i|)·Σ_t log(π_old/π_θ) > δ --------------------------------------


def reference_opsm(case: dict, delta: float) -> list[float]:
    keep = []
    for cur, old, adv, mask in zip(
        case["current"], case["behaviour"], case["advantages"], case["mask"], strict=True
    ):
        n = sum(mask)
        if n == 0:
            keep.append(1.0)
            continue
        kl = sum(o - c for o, c in zip(_counted(old, mask), _counted(cur, mask), strict=True)) / n
        advantage = sum(_counted(adv, mask)) / n
        keep.append(0.0 if advantage < 0 and kl > delta else 1.0)
    return keep


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("delta", [0.0, 1e-4, 0.05, 0.3])
def test_opsm_mask_matches_the_formula(seed, delta):
    case = _random_case(seed)
    keep, _ = opsm_keep(
        _t(case["current"]), _t(case["behaviour"]), _t(case["advantages"]), _t(case["mask"]), delta
    )
    assert keep.squeeze(-1).tolist() == reference_opsm(case, delta)


def test_opsm_drops_only_negative_sequences_that_moved_away():
    # Row 0: A < 0, KL 0.5 > δ → dropped. Row 1: A > 0, same KL → kept. Row 2: A < 0, KL −0.5 → kept.
    current = _t([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    old = _t([[-0.5, -0.5], [-0.5, -0.5], [-1.5, -1.5]])
    advantages = _t([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    keep, kl = opsm_keep(current, old, advantages, torch.ones_like(current), delta=0.1)
    assert keep.squeeze(-1).tolist() == [0.0, 1.0, 1.0]
    assert kl.tolist() == pytest.approx([0.5, 0.5, -0.5])


@pytest.mark.parametrize("seed", range(4))
def test_opsm_loss_zeroes_dropped_sequences_and_keeps_the_denominator(seed):
    """PPO-clip token-mean with OPSM equals (1/Σ|o_i|)·Σ_i Σ_t M_i·(−min(rA, clip(r)A))."""
    case, delta = _random_case(seed), 0.05
    inputs = _loss_inputs(case)
    loss, metrics = compute_policy_loss("ppo", inputs, LossConfig(name="ppo", opsm=OPSMConfig(delta=delta)))
    keep = reference_opsm(case, delta)
    total, count = 0.0, 0.0
    for i, mask in enumerate(case["mask"]):
        for t, m in enumerate(mask):
            if not m:
                continue
            ratio = math.exp(case["current"][i][t] - case["behaviour"][i][t])
            a = case["advantages"][i][t]
            total += keep[i] * -min(ratio * a, min(max(ratio, 0.8), 1.2) * a)
            count += 1
    assert loss.item() == pytest.approx(total / max(count, 1.0))
    dropped_tokens = sum(sum(mask) for mask, k in zip(case["mask"], keep, strict=True) if k == 0)
    assert metrics["opsm/masked_fraction"] == pytest.approx(dropped_tokens / max(count, 1.0))


def _loss_inputs(case: dict, **extra: object) -> PolicyLossInputs:
    return PolicyLossInputs(
        logprobs=_t(case["current"]).requires_grad_(True),
        behaviour_logprobs=_t(case["behaviour"]),
        advantages=_t(case["advantages"]),
        loss_mask=_t(case["mask"]),
        **extra,
    )


# ---- M2PO: mask the largest (log r)² one at a time until mean over the rest ≤ τ ------------------------------


def reference_m2po(
    log_ratio: list[list[float]], mask: list[list[float]], threshold: float
) -> list[list[float]]:
    keep = [[m for m in row] for row in mask]
    while True:
        kept = [(log_ratio[i][t] ** 2, i, t) for i, row in enumerate(keep) for t, k in enumerate(row) if k]
        if not kept or sum(v for v, _, _ in kept) / len(kept) <= threshold:
            return keep
        largest = max(v for v, _, _ in kept)
        _, i, t = next(entry for entry in kept if entry[0] == largest)  # ties: first in position order
        keep[i][t] = 0.0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("threshold", [0.01, 0.04, 0.2, 10.0])
def test_m2po_mask_matches_the_iterative_rule(seed, threshold):
    case = _random_case(seed, rows=8, width=9)
    log_ratio = [
        [c - b for c, b in zip(cr, br, strict=True)]
        for cr, br in zip(case["train"], case["behaviour"], strict=True)
    ]
    keep, second_moment = m2po_keep(_t(log_ratio), _t(case["mask"]), threshold)
    assert keep.tolist() == reference_m2po(log_ratio, case["mask"], threshold)
    counted = [v**2 for row, mask in zip(log_ratio, case["mask"], strict=True) for v in _counted(row, mask)]
    assert second_moment == pytest.approx(sum(counted) / len(counted) if counted else 0.0)


def test_m2po_breaks_ties_in_position_order():
    log_ratio = _t([[0.5, -0.5, 0.1]])  # two equal squares; masking the first one is enough
    keep, _ = m2po_keep(log_ratio, torch.ones_like(log_ratio), threshold=0.15)
    assert keep.tolist() == [[0.0, 1.0, 1.0]]


@pytest.mark.parametrize("seed", range(3))
def test_m2po_objective_gradient_matches_the_paper(seed):
    """M2PO's objective (1/Σ|o_i|)·Σ M_{i,t}·r_{i,t}·A_{i,t} with untruncated r (the m2po preset: tis, no cap):
    the loss's gradient is minus the objective's."""
    case, threshold = _random_case(seed), 0.04
    log_ratio = _t(case["train"]) - _t(case["behaviour"])
    keep, _ = m2po_keep(log_ratio, _t(case["mask"]), threshold)
    inputs = _loss_inputs(case, m2po_mask=keep)
    config = LossConfig(name="tis", tis=TISParams(cap=None), m2po=M2POConfig(threshold=threshold))
    loss, _ = compute_policy_loss("tis", inputs, config)
    loss.backward()
    current = _t(case["current"]).requires_grad_(True)
    mask = _t(case["mask"])
    ratio = torch.exp(current - _t(case["behaviour"]))
    objective = (keep * ratio * _t(case["advantages"]) * mask).sum() / mask.sum().clamp(min=1.0)
    objective.backward()
    assert torch.allclose(inputs.logprobs.grad, -current.grad, atol=1e-12)


def test_m2po_needs_the_trainers_mask():
    case = _random_case(0)
    with pytest.raises(ValueError, match="m2po_mask"):
        compute_policy_loss("ppo", _loss_inputs(case), LossConfig(m2po=M2POConfig()))


# ---- K3 rejection: drop a sequence whose mean_t (ρ_t − 1 − log ρ_t) > threshold, ρ = π_train/π_infer ----------


def reference_k3_keep(case: dict, threshold: float) -> list[float]:
    keep = []
    for train, infer, mask in zip(case["train"], case["behaviour"], case["mask"], strict=True):
        n = sum(mask)
        if n == 0:
            keep.append(1.0)
            continue
        ratios = [math.exp(a - b) for a, b in zip(_counted(train, mask), _counted(infer, mask), strict=True)]
        k3 = sum(r - 1 - math.log(r) for r in ratios) / n
        keep.append(1.0 if k3 <= threshold else 0.0)
    return keep


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("threshold", [1e-3, 0.01, 0.05])
def test_k3_rejection_matches_the_formula(seed, threshold):
    case = _random_case(seed, spread=0.3)
    keep, _ = k3_rejection_mask(_t(case["train"]), _t(case["behaviour"]), _t(case["mask"]), threshold)
    assert keep.squeeze(-1).tolist() == reference_k3_keep(case, threshold)


@pytest.mark.parametrize("seed", range(3))
def test_k3_rejection_loss_leaves_rejected_sequences_out_of_the_denominator(seed):
    """REINFORCE token-mean with K3-RS: (1/Σ_kept |o_i|)·Σ_kept Σ_t −A·log π (π_old := π_train_old, no weight)."""
    case, threshold = _random_case(seed, spread=0.3), 0.01
    inputs = _loss_inputs(case, train_behaviour_logprobs=_t(case["train"]))
    config = LossConfig(name="reinforce", k3_rejection=K3RejectionConfig(threshold=threshold))
    loss, metrics = compute_policy_loss("reinforce", inputs, config)
    keep = reference_k3_keep(case, threshold)
    total = count = 0.0
    for i, mask in enumerate(case["mask"]):
        for t, m in enumerate(mask):
            if m and keep[i]:
                total += -case["advantages"][i][t] * case["current"][i][t]
                count += 1
    assert loss.item() == pytest.approx(total / max(count, 1.0))
    nonempty = [k for k, mask in zip(keep, case["mask"], strict=True) if sum(mask)]
    assert metrics["k3_rejection/rejected_fraction"] == pytest.approx(nonempty.count(0.0) / len(nonempty))


# ---- Rejection-only mismatch (Geo-RS): weight 1 inside [low, high] of the geometric-mean ratio, else dropped --


@pytest.mark.parametrize("seed", range(4))
def test_reject_mode_keeps_units_unweighted(seed):
    case = _random_case(seed, spread=0.05)
    low, high = 0.98, 1.02
    config = LossConfig(mismatch=MismatchConfig(granularity="geometric", mode="reject", low=low, high=high))
    result = compute_step_start_correction(_t(case["train"]), _t(case["behaviour"]), _t(case["mask"]), config)
    for i, mask in enumerate(case["mask"]):
        n = sum(mask)
        logs = [
            a - b
            for a, b in zip(
                _counted(case["train"][i], mask), _counted(case["behaviour"][i], mask), strict=True
            )
        ]
        geometric = math.exp(sum(logs) / n) if n else 1.0
        expected = 1.0 if low <= geometric <= high else 0.0
        assert result.mask[i, 0].item() == expected
        assert result.weights[i, 0].item() == expected


def test_corrections_combine_weights_and_masks():
    """Seq-MIS and K3 rejection together: a sequence survives only if both keep it."""
    case = _random_case(7, spread=0.3)
    mismatch = MismatchConfig(granularity="sequence", mode="mask", low=0.5, high=2.0)
    config = LossConfig(mismatch=mismatch, k3_rejection=K3RejectionConfig(threshold=0.02))
    both = compute_step_start_correction(_t(case["train"]), _t(case["behaviour"]), _t(case["mask"]), config)
    alone = compute_step_start_correction(
        _t(case["train"]), _t(case["behaviour"]), _t(case["mask"]), replace(config, k3_rejection=None)
    )
    k3 = reference_k3_keep(case, 0.02)
    assert both.mask[:, 0].tolist() == [a * b for a, b in zip(alone.mask[:, 0].tolist(), k3, strict=True)]


def test_ppo_with_opsm_still_clips():
    """OPSM multiplies PPO's per-token loss; it does not replace the clip (dual clip stays available)."""
    case = _random_case(1)
    config = LossConfig(name="ppo", ppo=ClipParams(dual_clip=3.0), opsm=OPSMConfig(delta=10.0))
    loss_opsm, _ = compute_policy_loss("ppo", _loss_inputs(case), config)
    loss_plain, _ = compute_policy_loss("ppo", _loss_inputs(case), replace(config, opsm=None))
    assert loss_opsm.item() == pytest.approx(loss_plain.item())  # δ = 10: nothing is that far
