"""Groups into right-padded tensors, and the splits of a batch: PPO mini-batches and token-budget micro-batches.

Alignment convention (the one place it is decided): every ``[B, T]`` tensor is aligned with ``input_ids``, so
``behaviour_logprobs[b, t]`` is the log-prob of token ``input_ids[b, t]``, which the model predicts from the
logits at position ``t - 1``. Position 0 has no prediction, so its loss mask must be 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from asyncrl.types import Group, TrainBatch, Trajectory


def flatten_groups(groups: Sequence[Group]) -> tuple[list[Trajectory], list[int]]:
    """The trajectories of ``groups`` in order, and the index of each one's group (the batch's row order)."""
    trajectories = [t for group in groups for t in group.trajectories]
    group_ids = [i for i, group in enumerate(groups) for _ in group.trajectories]
    return trajectories, group_ids


def build_train_batch(
    groups: Sequence[Group], advantages: torch.Tensor | Sequence[float], *, pad_token_id: int = 0
) -> TrainBatch:
    """Right-padded ``TrainBatch`` of every trajectory of ``groups``, one row each, in group order.

    ``advantages`` holds one value per trajectory (same order); it is broadcast over the sample's model
    tokens and is 0 elsewhere. Raises ValueError for an empty input or a malformed trajectory.
    """
    trajectories, group_ids = flatten_groups(groups)
    if not trajectories:
        raise ValueError("build_train_batch needs at least one trajectory, got none")
    advantages_b = torch.as_tensor(advantages, dtype=torch.float32)
    if advantages_b.shape != (len(trajectories),):
        raise ValueError(
            f"advantages must have one value per trajectory ({len(trajectories)}), got shape "
            f"{tuple(advantages_b.shape)}"
        )
    for trajectory in trajectories:
        _check_trajectory(trajectory)
    loss_mask = _pad([t.loss_mask for t in trajectories], 0, torch.float32)
    return TrainBatch(
        input_ids=_pad([t.token_ids for t in trajectories], pad_token_id, torch.long),
        attention_mask=_pad([[1] * len(t.token_ids) for t in trajectories], 0, torch.long),
        loss_mask=loss_mask,
        behaviour_logprobs=_pad([t.logprobs for t in trajectories], 0.0, torch.float32) * loss_mask,
        token_versions=_pad([t.versions for t in trajectories], -1, torch.long).masked_fill(
            loss_mask == 0, -1
        ),
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        advantages=advantages_b[:, None] * loss_mask,
        token_rewards=_pad([token_rewards(t) for t in trajectories], 0.0, torch.float32),
        start_versions=torch.tensor([t.start_version for t in trajectories], dtype=torch.long),
        group_ids=torch.tensor(group_ids, dtype=torch.long),
        sample_uids=[t.uid for t in trajectories],
    )


def _check_trajectory(trajectory: Trajectory) -> None:
    """Reject sequences the aligned tensors cannot represent, naming the sample."""
    n = len(trajectory.token_ids)
    if n == 0:
        raise ValueError(f"trajectory {trajectory.uid} has no tokens")
    for name in ("loss_mask", "logprobs", "versions"):
        if len(getattr(trajectory, name)) != n:
            raise ValueError(
                f"trajectory {trajectory.uid}: {name} has {len(getattr(trajectory, name))} entries "
                f"for {n} tokens"
            )
    if trajectory.loss_mask[0]:
        raise ValueError(
            f"trajectory {trajectory.uid}: the first token cannot be trained (no logits predict it)"
        )
    if trajectory.token_rewards is not None:
        _check_token_rewards(trajectory)


def _check_token_rewards(trajectory: Trajectory) -> None:
    """Token rewards must align with the tokens, fall on model tokens only and sum to the reward."""
    rewards, mask = list(trajectory.token_rewards or ()), trajectory.loss_mask
    if len(rewards) != len(trajectory.token_ids):
        raise ValueError(
            f"trajectory {trajectory.uid}: token_rewards has {len(rewards)} entries for "
            f"{len(trajectory.token_ids)} tokens"
        )
    misplaced = [i for i, (r, m) in enumerate(zip(rewards, mask, strict=True)) if r != 0.0 and not m]
    if misplaced:
        raise ValueError(
            f"trajectory {trajectory.uid}: token_rewards on tokens the model did not generate {misplaced[:8]}"
        )
    total = math.fsum(rewards)
    if not math.isclose(total, trajectory.reward, rel_tol=1e-6, abs_tol=1e-6):
        raise ValueError(
            f"trajectory {trajectory.uid}: token_rewards sum to {total}, but its reward is {trajectory.reward}"
        )


def token_rewards(trajectory: Trajectory) -> list[float]:
    """The trajectory's rewards aligned with its tokens: its own ``token_rewards``, or else all of ``reward`` on
    the last model token (nowhere if it has none: nothing of it trains)."""
    if trajectory.token_rewards is not None:
        return list(trajectory.token_rewards)
    placed = [0.0] * len(trajectory.token_ids)
    last = max((i for i, m in enumerate(trajectory.loss_mask) if m), default=None)
    if last is not None:
        placed[last] = float(trajectory.reward)
    return placed


def _pad(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    """Stack ``rows`` right-padded with ``value`` to the longest row.

    Rows that are not lists (a loss mask is ``asyncrl.rle.RleSequence``) become lists first: ``torch.tensor`` would
    otherwise index them element by element."""
    width = max(len(row) for row in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row if isinstance(row, list) else list(row), dtype=dtype)
    return out


def sequence_lengths(batch: TrainBatch) -> list[int]:
    """Real (unpadded) length of each row."""
    return batch.attention_mask.sum(dim=1).tolist()


def select_rows(batch: TrainBatch, rows: Sequence[int]) -> TrainBatch:
    """The sub-batch of ``rows`` (in that order), with padding columns beyond its longest row dropped."""
    index = torch.as_tensor(list(rows), dtype=torch.long, device=batch.input_ids.device)
    width = int(batch.attention_mask[index].sum(dim=1).max())
    return TrainBatch(
        input_ids=batch.input_ids[index, :width],
        attention_mask=batch.attention_mask[index, :width],
        loss_mask=batch.loss_mask[index, :width],
        behaviour_logprobs=batch.behaviour_logprobs[index, :width],
        token_versions=batch.token_versions[index, :width],
        rewards=batch.rewards[index],
        advantages=batch.advantages[index, :width],
        token_rewards=batch.token_rewards[index, :width],
        start_versions=batch.start_versions[index],
        group_ids=batch.group_ids[index],
        sample_uids=[batch.sample_uids[i] for i in rows] if batch.sample_uids else [],
    )


def plan_micro_batches(lengths: Sequence[int], max_tokens: int, *, packed: bool = False) -> list[list[int]]:
    """Split sample indices into micro-batches whose size is at most ``max_tokens``: the padded size (rows ×
    longest row), or with ``packed`` the real token count (the packed trainer computes no padding).

    Samples are taken longest first (ties by index), so each micro-batch holds similar lengths and little
    padding; a micro-batch is closed when one more row would exceed the budget. Every index appears exactly
    once; a sample longer than the budget gets a micro-batch of its own.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = []
    for index in order:
        # Descending order: the first row of the open micro-batch is its longest.
        if packed:
            fits = plan and sum(lengths[i] for i in plan[-1]) + lengths[index] <= max_tokens
        else:
            fits = plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= max_tokens
        if fits:
            plan[-1].append(index)
        else:
            plan.append([index])
    return plan


def plan_mini_batches(
    num_samples: int, num_mini_batches: int, generator: torch.Generator | None = None
) -> list[list[int]]:
    """Split ``range(num_samples)`` into ``num_mini_batches`` near-equal parts (the first ones one larger).

    With a ``generator`` the samples are permuted first; without one the parts are contiguous.
    """
    if not 1 <= num_mini_batches <= num_samples:
        raise ValueError(
            f"num_mini_batches must be in [1, number of samples = {num_samples}], got {num_mini_batches}"
        )
    if generator is None:
        order = list(range(num_samples))
    else:
        order = torch.randperm(num_samples, generator=generator).tolist()
    return [part.tolist() for part in torch.tensor(order).tensor_split(num_mini_batches)]
