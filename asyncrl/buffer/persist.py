"""Buffered groups as plain JSON data, so a checkpoint keeps finished-but-untrained work across a restart.

Key decision: JSON, not pickle: a checkpoint is data that a later asyncrl version (or a person) can read, and
loading it never runs code. Python's float repr round-trips exactly, so a restored group trains to the same
weights as the group that was saved. Free-form ``info``/``timings``/``metadata`` values that are not JSON
become their ``repr`` (they are diagnostics; training does not read them).
"""

from __future__ import annotations

import json
from typing import Any

from asyncrl.types import Group, Trajectory, TrajectoryStatus

_SEQUENCES = ("token_ids", "loss_mask", "logprobs", "versions")


def groups_to_data(groups: list[tuple[int, Group]]) -> list[dict[str, Any]]:
    """``SampleBuffer.snapshot()`` output as JSON-ready dicts."""
    return [{"start_version": start, "group": _group_to_data(group)} for start, group in groups]


def groups_from_data(data: list[dict[str, Any]]) -> list[tuple[int, Group]]:
    """The inverse of ``groups_to_data``; ``ValueError`` naming the entry when one is malformed."""
    restored = []
    for index, entry in enumerate(data):
        try:
            restored.append((int(entry["start_version"]), _group_from_data(entry["group"])))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"checkpoint buffered group {index}: malformed ({err!r})") from err
    return restored


def _group_to_data(group: Group) -> dict[str, Any]:
    return {
        "prompt_uid": group.prompt_uid,
        "metadata": _plain(group.metadata),
        "trajectories": [_trajectory_to_data(t) for t in group.trajectories],
    }


def _trajectory_to_data(trajectory: Trajectory) -> dict[str, Any]:
    data = {name: list(getattr(trajectory, name)) for name in _SEQUENCES}
    return data | {
        "prompt_uid": trajectory.prompt_uid,
        "sample_index": trajectory.sample_index,
        "start_version": trajectory.start_version,
        "num_prompt_tokens": trajectory.num_prompt_tokens,
        "reward": trajectory.reward,
        "status": trajectory.status.value,
        "reason": trajectory.reason,
        "response_text": trajectory.response_text,
        "info": _plain(trajectory.info),
        "timings": _plain(trajectory.timings),
        "token_rewards": None if trajectory.token_rewards is None else list(trajectory.token_rewards),
    }


def _group_from_data(data: dict[str, Any]) -> Group:
    trajectories = [
        Trajectory(**{**t, "status": TrajectoryStatus(t["status"])}) for t in data["trajectories"]
    ]
    return Group(prompt_uid=data["prompt_uid"], trajectories=trajectories, metadata=data["metadata"])


def _plain(value: Any) -> Any:
    """``value`` if JSON can hold it as is, else its repr (recursively for dicts and lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
