"""The external-agent producer: the run serves the OpenAI-compatible endpoint and trains on what harnesses finish.

Key decision: a harness's trajectory joins a group (named in its URL, ``/groups/G/trajectories/T/v1``, or the
next open anonymous group) on its *first* call, and a group takes a buffer admission ticket when its first
trajectory arrives, so the α rule bounds external work exactly as it bounds the built-in producers: when the
buffer is at capacity the first call of a new group waits (back-pressure, never an error). A group is handed
in once ``rollout.num_return_sequences`` of its trajectories have ended.

::

    harness ─► /v1/chat/completions (first call) ─► admit: group ticket (may wait) ─► proxy ─► tokens recorded
    harness ─► /trajectories/T/finish {reward}    ─► ended ─► group complete? ─► buffer.put | release
    controller ─► abort_stale: stale groups released now; their trajectories are still served, then dropped

Restarts: a run restarted from its checkpoint (``TrainerDied``) builds a new producer, which binds the same
port (``endpoint_record.keep_port``) and refuses, with 409 ``run_restarted``, the trajectories and groups an
earlier attempt admitted (``endpoint_record.TrajectoryLedger``): it holds none of their tokens.

Conservation: every trajectory that took a place in a group ends exactly once, in a group handed to
``buffer.put`` or counted dropped with a reason; every ticket ends with one ``put`` or ``release``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.buffer.records import Admission, DropKind
from asyncrl.buffer.sample_buffer import BufferClosedError, SampleBuffer
from asyncrl.config.serve import ServeConfig
from asyncrl.rollout import endpoint_record
from asyncrl.rollout.admission import admit
from asyncrl.rollout.prompt_source import Prompt, PromptSource
from asyncrl.serve.schemas import ServeError
from asyncrl.serve.server import EndpointServer
from asyncrl.serve.service import CompletionService, GenerateClient
from asyncrl.serve.trajectories import ServedTrajectory, TrajectoryState
from asyncrl.types import Group, Trajectory, TrajectoryStatus

STATUS_OF_STATE = {
    TrajectoryState.FINISHED: TrajectoryStatus.COMPLETED,
    TrajectoryState.FAILED: TrajectoryStatus.FAILED,
    TrajectoryState.ABORTED: TrajectoryStatus.ABORTED,
}
CLOSE_POLL_S = 0.05
"""How often ``run`` looks whether the buffer was closed (the buffer has no close event to await)."""


@dataclass(kw_only=True)
class _Group:
    name: str | None
    admission: Admission
    prompt: Prompt
    members: list[str] = field(default_factory=list)
    ended: list[Trajectory] = field(default_factory=list)
    released: str | None = None
    """Why the group was released early (stale); its trajectories are then dropped as they end."""


class ExternalProducer:
    """Serves the endpoint for the run and turns finished trajectories into buffered groups."""

    def __init__(
        self,
        *,
        source: PromptSource,
        proxy: GenerateClient,
        buffer: SampleBuffer,
        tokenizer: Any,
        config: ServeConfig,
        output_dir: str,
        seed: int,
        name: str = "external",
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.source = source
        self.buffer = buffer
        self.name = name
        self.output_dir = Path(output_dir)
        self.service = CompletionService(
            proxy=proxy,
            tokenizer=tokenizer,
            config=config,
            sink=self,
            seed=seed,
            chat_template_kwargs=chat_template_kwargs,
        )
        self.server = EndpointServer(self.service, bind_timeout_s=config.bind_timeout_s)
        self.ledger = endpoint_record.TrajectoryLedger(self.output_dir)
        self.counts = {status.value: 0 for status in TrajectoryStatus} | {"trajectories": 0, "groups": 0}
        self._named: dict[str, _Group] = {}
        self._open: _Group | None = None
        self._group_of: dict[str, _Group] = {}
        self._admitting = asyncio.Lock()

    async def run(self) -> None:
        """Serve until the buffer is closed; then release the groups still open and stop the server."""
        await self.server.start()
        endpoint_record.publish(self.output_dir, self.server.url + "/v1")
        try:
            while not self.buffer.closed:
                await asyncio.sleep(CLOSE_POLL_S)
        finally:
            await self.server.stop()
            for group in {id(g): g for g in self._group_of.values()}.values():
                if group.released is None and len(group.ended) < self.buffer.group_size:
                    self._release(group, DropKind.ABORTED, "producer stopped")

    async def abort_stale(self) -> int:
        stale = {a.ticket_id for a in self.buffer.untrainable_in_flight()}
        groups = [
            g
            for g in {id(g): g for g in self._group_of.values()}.values()
            if g.released is None and g.admission.ticket_id in stale
        ]
        for group in groups:
            self._release(group, DropKind.ABORTED, "stale: its batch was already trained")
        return len(groups)

    # ---- the endpoint's sink --------------------------------------------------------------------------------

    def check(self, trajectory_id: str, group_id: str | None) -> None:
        self.ledger.check(trajectory_id, group_id)

    def may_wait(self, trajectory: ServedTrajectory) -> bool:
        """Whether ``admit`` may wait: the trajectory opens a new group (it can join none open now)."""
        return self._joinable(trajectory.group_id) is None

    async def admit(self, trajectory: ServedTrajectory) -> None:
        """Place a new trajectory in its group (opening it, and waiting for a ticket, if needed).

        Joining a group that is open already never waits: only opening one takes the lock, which a first call
        holds while it waits for capacity. Behind that lock, a member of an admitted group would wait for
        capacity that only its own group's completion (a trained batch) can free: the run would hang."""
        group = self._joinable(trajectory.group_id)
        if group is None:
            async with self._admitting:  # one group opens at a time, so two first calls never open two
                group = self._joinable(trajectory.group_id) or await self._new_group(trajectory.group_id)
        group.members.append(trajectory.trajectory_id)
        self._group_of[trajectory.trajectory_id] = group
        self.counts["trajectories"] += 1
        self.ledger.record(trajectory.trajectory_id, trajectory.group_id)

    def ended(self, trajectory: ServedTrajectory) -> None:
        group = self._group_of.get(trajectory.trajectory_id)
        if group is None:  # ended before its first call was admitted: nothing was generated for training
            return
        status = STATUS_OF_STATE[trajectory.state]
        sample = trajectory.to_trajectory(status, trajectory.reason, group.admission.start_version)
        sample.prompt_uid, sample.sample_index = (
            group.prompt.key,
            group.members.index(trajectory.trajectory_id),
        )
        if group.released is not None:
            self._count_dropped(status if not status.trainable else TrajectoryStatus.ABORTED)
            return
        group.ended.append(sample)
        if len(group.ended) == self.buffer.group_size:
            self._hand_in(group)

    def _joinable(self, name: str | None) -> _Group | None:
        """The open group a new trajectory naming group ``name`` (None: anonymous) joins; None when a group must
        be opened (an anonymous one is full or released, or no group has that name yet); a 409 when the named
        group can take no one (all its members came, or it was released)."""
        group = self._named.get(name) if name else self._open
        if group is not None and group.released is None and len(group.members) < self.buffer.group_size:
            return group
        if name and group is not None:
            raise ServeError(
                409,
                f"group {name!r} already has {len(group.members)} trajectories (rollout.num_return_sequences)",
                "group_id",
                "conflict_error",
            )
        return None

    # ---- groups ---------------------------------------------------------------------------------------------

    async def _new_group(self, name: str | None) -> _Group:
        try:
            admission, prompt = await admit(self.source, self.buffer, self.name)
        except BufferClosedError as err:
            raise ServeError(
                503,
                "the training run stopped taking trajectories (it finished, or restarts from its checkpoint)",
                None,
                "server_error",
            ) from err
        group = _Group(name=name, admission=admission, prompt=prompt)
        if name is None:
            self._open = group
        else:
            self._named[name] = group
        self.counts["groups"] += 1
        return group

    def _hand_in(self, group: _Group) -> None:
        kept = [t for t in group.ended if t.status.trainable]
        for t in group.ended:
            if not t.status.trainable:
                self._count_dropped(t.status)
        if not kept:
            self._release(group, DropKind.FAILED, "; ".join(sorted({t.reason for t in group.ended})))
            return
        self.counts[TrajectoryStatus.COMPLETED.value] += len(kept)
        group.released = "handed in"
        if not self.buffer.put(group.admission, Group(prompt_uid=group.prompt.key, trajectories=kept)):
            self.source.finish(group.prompt.key)

    def _release(self, group: _Group, kind: DropKind, reason: str) -> None:
        group.released = reason
        for t in group.ended:
            self._count_dropped(t.status if not t.status.trainable else TrajectoryStatus.ABORTED)
        try:
            self.buffer.release(group.admission, kind, reason)
        finally:
            self.source.finish(group.prompt.key)

    def _count_dropped(self, status: TrajectoryStatus) -> None:
        self.counts[status.value] += 1
