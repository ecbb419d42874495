"""The agentic producer: env groups of EnvManagers playing multi-turn episodes into the SampleBuffer.

Key decision: the same seams and lifecycle as ``RLVRProducer`` (admission ticket → group → ``put`` or
``release``; ``run`` and ``abort_stale`` for the controller), with an env seed in place of a prompt. A group
resets ``env_manager.group_size`` envs with one seed and is complete once ``rollout.num_return_sequences``
episodes ended trainable; its other episodes are cut. ``env_manager.num_env_groups`` groups run at once, so
groups beyond the batch (redundant env groups) and episodes beyond the group size are the slack that keeps
slow or failing environments off the critical path; what is cut is recorded, never silently lost. With
``env_manager.episode_replays`` a failed episode the group cannot do without is played again (a new episode
on the same slot), so groups stay full.

::

    stepping: async   num_env_groups × loop: acquire_admission ─► group_size × EnvManager.run_episode ─┐
    stepping: batch   rounds: admit ≤ num_env_groups ─► every episode in Lockstep each turn ────────────┤
                                                                                                      ▼
        first num_return_sequences trainable ─► Group ─► buffer.put      rest cut ─► on_dropped(trajectory)
        none trainable / filtered / producer stopped ─► buffer.release(kind, reason)

Conservation: every episode started ends exactly once, either inside a group handed to ``buffer.put`` or
through ``on_dropped`` with a non-trainable status and a reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from asyncrl.buffer.records import Admission, DropKind
from asyncrl.buffer.sample_buffer import BufferClosedError, SampleBuffer
from asyncrl.config.env import EnvManagerConfig, check_env_manager_fits
from asyncrl.config.rollout import RolloutConfig
from asyncrl.data.base import TaskSample
from asyncrl.envs.base import Env
from asyncrl.rollout.admission import admit, admit_batch
from asyncrl.rollout.env_manager import EnvManager, GroupControl, env_seed
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.lockstep import Lockstep
from asyncrl.rollout.prompt_source import Prompt, PromptSource
from asyncrl.rollout.rlvr_producer import GenerateClient, make_group_filter
from asyncrl.types import Group, Trajectory, TrajectoryStatus

STOPPED = "producer stopped"


def make_env_seed_source(num_seeds: int, seed: int) -> PromptSource:
    """A prompt source over ``num_seeds`` env-seed slots (each epoch's key gives its env a fresh seed)."""
    return PromptSource(
        [TaskSample(uid=f"env{i}", prompt="", answer="") for i in range(num_seeds)], seed=seed
    )


@dataclasses.dataclass
class _RunningGroup:
    admission: Admission
    prompt: Prompt
    control: GroupControl
    managers: list[EnvManager]
    """The EnvManager each episode runs on, by episode index (a replay runs on its failed episode's)."""
    episodes: list[Episode]
    tasks: list[asyncio.Task[Trajectory]]
    replays_left: int = 0


class AgenticProducer:
    """Keeps the buffer supplied with groups of episodes until the buffer closes."""

    def __init__(
        self,
        *,
        source: PromptSource,
        proxy: GenerateClient,
        buffer: SampleBuffer,
        tokenizer: Any,
        rollout: RolloutConfig,
        config: EnvManagerConfig,
        make_env: Callable[[], Env],
        seed: int,
        name: str = "agentic",
        on_dropped: Callable[[Trajectory], None] = lambda trajectory: None,
    ) -> None:
        check_env_manager_fits(config, buffer.group_size, buffer.groups_per_batch)
        self.source = source
        self.proxy = proxy
        self.buffer = buffer
        self.config = config
        self.seed = seed
        self.name = name
        self.on_dropped = on_dropped
        self._filter = make_group_filter(rollout.filter)
        manager_args = dict(
            make_env=make_env, proxy=proxy, tokenizer=tokenizer, rollout=rollout, config=config
        )
        self._slots = [
            [EnvManager(**manager_args, seed=seed) for _ in range(config.group_size)]
            for _ in range(config.num_env_groups)
        ]
        self._live: dict[int, _RunningGroup] = {}
        self.counts = {status.value: 0 for status in TrajectoryStatus} | {"episodes": 0}

    @property
    def num_env_replacements(self) -> int:
        return sum(manager.num_replacements for slot in self._slots for manager in slot)

    async def run(self) -> None:
        """Produce groups until the buffer is closed. Async stepping stops as soon as one env group sees the
        close: the others are cancelled, their running episodes cut and recorded ("producer stopped").
        Batch stepping finishes its round first (the closed buffer records what it hands in)."""
        loops: list[asyncio.Task[None]] = []
        try:
            if self.config.stepping == "async":
                loops = [asyncio.ensure_future(self._group_loop(slot)) for slot in self._slots]
                done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raises a crashed loop's error
            else:
                while True:
                    await self._round()
        except BufferClosedError:
            pass
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def abort_stale(self) -> int:
        """Cut the groups that can no longer be trained fresh (e.g. redundant ones once their batch was
        trained); they end as aborted, recorded. Returns how many groups."""
        stale = [
            self._live[a.ticket_id] for a in self.buffer.untrainable_in_flight() if a.ticket_id in self._live
        ]
        await asyncio.gather(*(group.control.cut("stale: its batch was already trained") for group in stale))
        return len(stale)

    # ---- the two steppings ------------------------------------------------------------------------------

    async def _group_loop(self, slot: list[EnvManager]) -> None:
        """Environment-level async: one env group plays group after group, independently of the others."""
        try:
            while True:
                admission, prompt = await admit(self.source, self.buffer, self.name)
                await self._collect(self._start(admission, prompt, slot, None))
        except BufferClosedError:
            return

    async def _round(self) -> None:
        """The batch baseline: admit up to num_env_groups groups and run all their episodes in lockstep."""
        admitted = await admit_batch(self.source, self.buffer, self.name, len(self._slots))
        lockstep = Lockstep()
        groups = [self._start(a, p, self._slots[i], lockstep) for i, (a, p) in enumerate(admitted)]
        await asyncio.gather(*(self._collect(group) for group in groups))

    # ---- one group --------------------------------------------------------------------------------------

    def _start(
        self, admission: Admission, prompt: Prompt, slot: list[EnvManager], lockstep: Lockstep | None
    ) -> _RunningGroup:
        """Start the group's episodes (joining the lockstep before any of them runs)."""
        control = GroupControl(self.proxy, lockstep)
        seed = env_seed(self.seed, prompt.key)
        episodes = [Episode(prompt.key, i, seed, admission.start_version) for i in range(len(slot))]
        if lockstep is not None:
            for _ in episodes:
                lockstep.join()
        tasks = [
            asyncio.ensure_future(manager.run_episode(episode, control))
            for manager, episode in zip(slot, episodes, strict=True)
        ]
        self.counts["episodes"] += len(episodes)
        group = _RunningGroup(
            admission, prompt, control, list(slot), episodes, tasks, replays_left=self.config.episode_replays
        )
        self._live[admission.ticket_id] = group
        return group

    def _replay(self, group: _RunningGroup, failed: Trajectory) -> None:
        """Play the failed episode's seed again on its slot (whose env was replaced), as a new episode."""
        manager = group.managers[failed.sample_index]
        episode = Episode(
            group.prompt.key, len(group.episodes), group.episodes[0].env_seed, group.admission.start_version
        )
        group.managers.append(manager)
        group.episodes.append(episode)
        group.tasks.append(asyncio.ensure_future(manager.run_episode(episode, group.control)))
        group.replays_left -= 1
        self.counts["episodes"] += 1

    async def _collect(self, group: _RunningGroup) -> None:
        """Keep the first ``group_size`` trainable episodes, cut the rest, then hand the group in. A failed
        episode is played again (``env_manager.episode_replays``) when the others could not fill the group."""
        wanted = self.buffer.group_size
        kept: list[Trajectory] = []
        dropped: list[Trajectory] = []
        finished: asyncio.Queue[asyncio.Task[Trajectory]] = asyncio.Queue()  # in the order they finish
        for task in group.tasks:
            task.add_done_callback(finished.put_nowait)
        try:
            while len(kept) + len(dropped) < len(group.tasks):
                trajectory = (await finished.get()).result()
                if trajectory.status.trainable and len(kept) < wanted:
                    kept.append(trajectory)
                else:
                    dropped.append(
                        _dropped_as(
                            trajectory, TrajectoryStatus.ABORTED, f"redundant: group already had {wanted}"
                        )
                    )
                running = len(group.tasks) - len(kept) - len(dropped)
                if (
                    trajectory.status is TrajectoryStatus.FAILED
                    and group.replays_left
                    and len(kept) + running < wanted
                ):
                    self._replay(group, trajectory)
                    group.tasks[-1].add_done_callback(finished.put_nowait)
                if len(kept) == wanted and len(kept) + len(dropped) < len(group.tasks):
                    await group.control.cut(f"redundant: group already had {wanted} trajectories")
        except asyncio.CancelledError:
            await self._stop(group, kept, dropped)
            raise
        self._finish(group, kept, dropped)

    def _finish(self, group: _RunningGroup, kept: list[Trajectory], dropped: list[Trajectory]) -> None:
        self._live.pop(group.admission.ticket_id, None)
        for trajectory in dropped:
            self._report_dropped(trajectory)
        if not kept:
            aborted = any(t.status is TrajectoryStatus.ABORTED for t in dropped)
            reasons = "; ".join(sorted({t.reason for t in dropped}))
            self._release(group, DropKind.ABORTED if aborted else DropKind.FAILED, reasons)
            return
        batch_group = Group(
            prompt_uid=group.prompt.key,
            trajectories=kept,
            metadata={"dropped_samples": [(t.uid, t.status.value, t.reason) for t in dropped]},
        )
        if self._filter is not None and not self._filter(batch_group):
            for trajectory in kept:
                self._report_dropped(_dropped_as(trajectory, TrajectoryStatus.FILTERED, "group filtered"))
            self._release(group, DropKind.FILTERED, "group filtered")
            return
        self.counts[TrajectoryStatus.COMPLETED.value] += sum(
            t.status is TrajectoryStatus.COMPLETED for t in kept
        )
        self.counts[TrajectoryStatus.TRUNCATED.value] += sum(
            t.status is TrajectoryStatus.TRUNCATED for t in kept
        )
        if not self.buffer.put(group.admission, batch_group):
            self.source.finish(group.prompt.key)

    async def _stop(self, group: _RunningGroup, kept: list[Trajectory], dropped: list[Trajectory]) -> None:
        """The producer is stopping: cut and wait for the episodes, record every one, release the group."""
        await group.control.cut(STOPPED)
        finished = {t.sample_index for t in kept + dropped}
        rest = await asyncio.gather(
            *(t for e, t in zip(group.episodes, group.tasks, strict=True) if e.index not in finished)
        )
        self._live.pop(group.admission.ticket_id, None)
        for trajectory in dropped + [_dropped_as(t, TrajectoryStatus.ABORTED, STOPPED) for t in kept + rest]:
            self._report_dropped(trajectory)
        self.buffer.release(group.admission, DropKind.ABORTED, STOPPED)
        self.source.interrupt(group.prompt.key)  # not ended: a resumed run plays this env seed again

    def _release(self, group: _RunningGroup, kind: DropKind, reason: str) -> None:
        self.buffer.release(group.admission, kind, reason)
        self.source.finish(group.prompt.key)

    def _report_dropped(self, trajectory: Trajectory) -> None:
        assert not trajectory.status.trainable, f"{trajectory.uid} is trainable but reported dropped"
        self.counts[trajectory.status.value] += 1
        self.on_dropped(trajectory)


def _dropped_as(trajectory: Trajectory, status: TrajectoryStatus, reason: str) -> Trajectory:
    """How a trajectory left out of the batch is recorded: a trainable one takes ``status`` and ``reason``
    (it was cut, filtered or stopped with its group); one that already ended untrainable keeps its own."""
    if trajectory.status.trainable:
        return dataclasses.replace(trajectory, status=status, reason=reason)
    return trajectory
