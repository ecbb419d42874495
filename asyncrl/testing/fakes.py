"""Small record builders for tests of the buffer, producers and controller (no model, no tokenizer)."""

from __future__ import annotations

from asyncrl.types import Group, Trajectory


def make_group(prompt_uid: str, start_version: int, group_size: int = 2, reward: float = 0.0) -> Group:
    """A group of ``group_size`` one-token responses to a one-token prompt, all started at ``start_version``."""
    trajectories = [
        Trajectory(
            prompt_uid=prompt_uid,
            sample_index=index,
            token_ids=[1, 2],
            loss_mask=[0, 1],
            logprobs=[0.0, -1.0],
            versions=[-1, start_version],
            start_version=start_version,
            num_prompt_tokens=1,
            reward=reward,
        )
        for index in range(group_size)
    ]
    return Group(prompt_uid=prompt_uid, trajectories=trajectories)
