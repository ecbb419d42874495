"""The trajectories a server holds: named by the harness, live until it posts a reward (or goes silent).

Lifecycle (``TrajectoryState``): live → finished (reward posted or scored) | failed (silent past
``serve.trajectory_timeout_s``) | aborted (the harness gave it up). Each ends exactly once; the end is
reported to the sink (a training run's external producer, or nothing) and appended to the export file.
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from asyncrl.config.serve import ServeConfig
from asyncrl.serve.chat_format import ChatFormat, PlainFormat
from asyncrl.serve.schemas import ServeError
from asyncrl.serve.tito import Branch, TrajectoryTokens
from asyncrl.types import Trajectory, TrajectoryStatus

TRAJECTORY_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""What a trajectory or group id may look like (it appears in URLs, request ids and export lines)."""


class TrajectoryState(str, enum.Enum):
    LIVE = "live"
    FINISHED = "finished"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass(kw_only=True)
class ServedTrajectory:
    """One trajectory: its token branches, its group, and how it ended."""

    trajectory_id: str
    group_id: str | None
    kind: str
    """``chat`` or ``completion``: the route that started it (a trajectory stays on one)."""
    tokens: TrajectoryTokens
    created_at: float
    last_active: float
    state: TrajectoryState = TrajectoryState.LIVE
    reward: float | None = None
    reason: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    admitted: bool = False
    """Whether the sink has taken it into a group (its first call waits for that)."""
    admitting: int = 0
    """Its calls waiting for it to be admitted (the first, and any sent meanwhile, e.g. a client's retry)."""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def live_branch(self) -> Branch | None:
        return self.tokens.live

    def to_trajectory(self, status: TrajectoryStatus, reason: str, start_version: int) -> Trajectory:
        """The live branch as a training sample (earlier branches are exported, not trained)."""
        branch = self.live_branch or Branch(branch_id=0)
        model_versions = [v for v, m in zip(branch.versions, branch.loss_mask, strict=True) if m]
        return Trajectory(
            prompt_uid=self.group_id or self.trajectory_id,
            sample_index=0,
            token_ids=list(branch.token_ids),
            loss_mask=list(branch.loss_mask),
            logprobs=list(branch.logprobs),
            versions=list(branch.versions),
            start_version=min(model_versions) if model_versions else start_version,
            num_prompt_tokens=branch.num_prompt_tokens,
            reward=self.reward or 0.0,
            status=status,
            reason=reason,
            info={
                "trajectory_id": self.trajectory_id,
                "turns": branch.num_turns,
                "branches": len(self.tokens.branches),
            },
        )

    def export(self) -> list[dict[str, Any]]:
        """One JSON-ready record per branch: ids, tokens, mask, log-probs, versions, reward, end state."""
        return [
            {
                "trajectory_id": self.trajectory_id,
                "group_id": self.group_id,
                "branch": b.branch_id,
                "parent_branch": b.parent,
                "branch_reason": b.reason,
                "live": b is self.live_branch,
                "state": self.state.value,
                "reason": self.reason,
                "reward": self.reward,
                "num_turns": b.num_turns,
                "token_ids": b.token_ids,
                "loss_mask": b.loss_mask,
                "logprobs": b.logprobs,
                "versions": b.versions,
            }
            for b in self.tokens.branches
        ]


class TrajectorySink(Protocol):
    """Where trajectories go: ``check`` before any call names a trajectory, ``admit`` before a trajectory's
    first generation (may wait: back-pressure; ``may_wait`` says beforehand whether it might), ``ended`` once
    when it ends. A training run's external producer; ``NullSink`` when serving alone."""

    def check(self, trajectory_id: str, group_id: str | None) -> None:
        """Raise ``ServeError`` for a trajectory the sink will never take (one an earlier attempt of a
        restarted run served), before the store holds anything of it."""
        ...

    def may_wait(self, trajectory: ServedTrajectory) -> bool:
        """Whether ``admit`` may wait for ``trajectory`` (False: it returns without suspending); raises the
        ``ServeError`` ``admit`` would."""
        ...

    async def admit(self, trajectory: ServedTrajectory) -> None: ...

    def ended(self, trajectory: ServedTrajectory) -> None: ...


class NullSink:
    def check(self, trajectory_id: str, group_id: str | None) -> None:
        return None

    def may_wait(self, trajectory: ServedTrajectory) -> bool:
        return False

    async def admit(self, trajectory: ServedTrajectory) -> None:
        return None

    def ended(self, trajectory: ServedTrajectory) -> None:
        return None


class TrajectoryStore:
    """The named trajectories of one server, bounded by ``serve.max_trajectories``."""

    def __init__(
        self,
        config: ServeConfig,
        chat_format: ChatFormat,
        tokenizer: Any,
        sink: TrajectorySink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.chat_format = chat_format
        self.tokenizer = tokenizer
        self.sink = sink or NullSink()
        self.clock = clock
        self._trajectories: dict[str, ServedTrajectory] = {}
        self._export = Path(config.export_path) if config.export_path else None
        self.counts = {state.value: 0 for state in TrajectoryState}

    def get(self, trajectory_id: str) -> ServedTrajectory:
        trajectory = self._trajectories.get(trajectory_id)
        if trajectory is None:
            raise ServeError(404, f"no trajectory {trajectory_id!r}", "trajectory_id", "not_found_error")
        return trajectory

    def new_tokens(self, kind: str) -> TrajectoryTokens:
        """Token state for a ``chat`` trajectory (the server's chat format) or a ``completion`` one (raw text)."""
        return TrajectoryTokens(self.chat_format if kind == "chat" else PlainFormat(), self.tokenizer)

    def open(self, trajectory_id: str, group_id: str | None, kind: str = "chat") -> ServedTrajectory:
        """The live trajectory ``trajectory_id`` (created on first use); 409 if it already ended or was
        started by the other route (chat vs completions)."""
        check_id("trajectory_id", trajectory_id)
        if group_id is not None:
            check_id("group_id", group_id)
        trajectory = self._trajectories.get(trajectory_id)
        if trajectory is None:
            self._make_room()
            now = self.clock()
            trajectory = ServedTrajectory(
                trajectory_id=trajectory_id,
                group_id=group_id,
                kind=kind,
                tokens=self.new_tokens(kind),
                created_at=now,
                last_active=now,
            )
            self._trajectories[trajectory_id] = trajectory
            self.counts[TrajectoryState.LIVE.value] += 1
        if trajectory.kind != kind:
            raise ServeError(
                409,
                f"trajectory {trajectory_id!r} is a {trajectory.kind} trajectory; "
                f"it cannot continue on the {kind} route",
                "trajectory_id",
                "conflict_error",
            )
        if trajectory.group_id != group_id:
            raise ServeError(
                409,
                f"trajectory {trajectory_id!r} belongs to group {trajectory.group_id!r}",
                "group_id",
                "conflict_error",
            )
        if trajectory.state is not TrajectoryState.LIVE:
            raise ServeError(
                409,
                f"trajectory {trajectory_id!r} already ended ({trajectory.state.value}"
                f"{': ' + trajectory.reason if trajectory.reason else ''})",
                "trajectory_id",
                "conflict_error",
            )
        trajectory.last_active = self.clock()
        return trajectory

    def end(
        self,
        trajectory: ServedTrajectory,
        state: TrajectoryState,
        *,
        reward: float | None = None,
        reason: str = "",
    ) -> None:
        """End a live trajectory once: record it, export it, hand it to the sink."""
        if trajectory.state is not TrajectoryState.LIVE:
            raise ServeError(
                409,
                f"trajectory {trajectory.trajectory_id!r} already ended ({trajectory.state.value})",
                "trajectory_id",
                "conflict_error",
            )
        trajectory.state, trajectory.reward, trajectory.reason = state, reward, reason
        self.counts[TrajectoryState.LIVE.value] -= 1
        self.counts[state.value] += 1
        if self._export is not None:
            with self._export.open("a") as out:
                for record in trajectory.export():
                    out.write(json.dumps(record) + "\n")
        self.sink.ended(trajectory)

    def expire(self) -> list[ServedTrajectory]:
        """End every live trajectory silent for longer than ``serve.trajectory_timeout_s`` (not one whose
        call is running: a slow engine is not a silent harness)."""
        deadline = self.clock() - self.config.trajectory_timeout_s
        silent = [
            t
            for t in self._trajectories.values()
            if t.state is TrajectoryState.LIVE and t.last_active < deadline and not t.lock.locked()
        ]
        for trajectory in silent:
            self.end(
                trajectory,
                TrajectoryState.FAILED,
                reason=f"harness silent for more than serve.trajectory_timeout_s={self.config.trajectory_timeout_s}s",
            )
        return silent

    def live(self) -> list[ServedTrajectory]:
        return [t for t in self._trajectories.values() if t.state is TrajectoryState.LIVE]

    def all(self) -> list[ServedTrajectory]:
        return list(self._trajectories.values())

    def _make_room(self) -> None:
        if len(self._trajectories) < self.config.max_trajectories:
            return
        ended = next((k for k, t in self._trajectories.items() if t.state is not TrajectoryState.LIVE), None)
        if ended is None:
            raise ServeError(
                429,
                f"{self.config.max_trajectories} trajectories are live "
                "(serve.max_trajectories); finish some first",
                None,
                "rate_limit_error",
            )
        del self._trajectories[ended]  # oldest ended first (dicts keep insertion order); already exported


def check_id(field_name: str, value: str) -> None:
    if not TRAJECTORY_ID.fullmatch(value):
        raise ServeError(
            400, f"{field_name} must match {TRAJECTORY_ID.pattern}, got {value[:64]!r}", field_name
        )
