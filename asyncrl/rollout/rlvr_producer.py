"""The RLVR producer: prompts in, scored and filtered groups out, one asyncio task per request.

Key decision: fine-grained lifecycles. Each response is its own task (``generation: queue``): it is scored the
moment it finishes, while its siblings and other prompts keep generating, and a group reaches the buffer when
its last member is scored. ``generation: batch`` is the naive baseline kept for comparison: a whole step's
responses are generated, and only then all scored.

::

    buffer.acquire_admission ─► PromptSource.next ─► n × (proxy.generate ─► rewards.score) ─► Group
                                                                                 │ filter?
                                          buffer.put(group) ◄── keep ────────────┤
                                          buffer.release(filtered | failed) ◄────┘

Every admitted group ends in exactly one ``put`` or ``release`` (conservation); the prompt source is told when
a prompt is dropped, and the controller tells it when one is trained.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from asyncrl.buffer.records import Admission, DropKind
from asyncrl.buffer.sample_buffer import BufferClosedError, SampleBuffer
from asyncrl.config.rollout import RolloutConfig
from asyncrl.data.base import prompt_token_ids
from asyncrl.rewards.service import RewardResult, RewardService, RewardStatus
from asyncrl.rle import RleSequence
from asyncrl.rollout.admission import admit, admit_batch
from asyncrl.rollout.prompt_source import Prompt, PromptSource
from asyncrl.rollout.reward_placement import rewards_on_tokens
from asyncrl.serve.chat_format import PromptStops
from asyncrl.types import (
    FinishReason,
    Generation,
    Group,
    Request,
    SamplingParams,
    Trajectory,
    TrajectoryStatus,
)

GroupFilter = Callable[[Group], bool]


class GenerateClient(Protocol):
    """What the producer needs of the proxy."""

    async def generate(self, request: Request) -> Generation: ...

    async def abort(self, request_id: str) -> Generation | None: ...


def make_group_filter(name: str) -> GroupFilter | None:
    """The filter ``rollout.filter`` names: None keeps every group."""
    if name == "none":
        return None
    if name == "zero_variance":
        return has_reward_variance
    module_name, _, attr = name.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def has_reward_variance(group: Group) -> bool:
    """Keep a group only if its rewards differ: with equal rewards every GRPO advantage is zero."""
    return len(set(group.rewards)) > 1


def request_seed(run_seed: int, prompt_key: str, sample_index: int) -> int:
    """A request's sampling seed, from (run seed, prompt, sample index) only, so outputs do not depend on
    which engine or batch the request lands in (DESIGN.md §7)."""
    digest = hashlib.blake2b(f"{run_seed}\0{prompt_key}\0{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def sampling_params(
    rollout: RolloutConfig, seed: int, stop_token_ids: tuple[int, ...] = ()
) -> SamplingParams:
    """How every rollout request samples: the ``rollout`` section's settings, with the request's ``seed`` and
    the stop tokens its prompt's format adds to the model's EOS (``PromptStops``, ``Turns.stop_token_ids``)."""
    return SamplingParams(
        max_new_tokens=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop_token_ids=stop_token_ids,
        stop_strings=rollout.stop_strings,
        seed=seed,
    )


def response_text(generation: Generation, tokenizer: Any) -> str:
    """The generation's text: the engine's own decoding if it sent one, else the tokenizer's."""
    if generation.text is not None:
        return generation.text
    return tokenizer.decode(generation.token_ids, skip_special_tokens=True)


class RLVRProducer:
    """Keeps the buffer supplied with groups until the buffer closes."""

    def __init__(
        self,
        *,
        source: PromptSource,
        proxy: GenerateClient,
        rewards: RewardService,
        buffer: SampleBuffer,
        tokenizer: Any,
        config: RolloutConfig,
        seed: int,
        name: str = "rlvr",
    ) -> None:
        self.source = source
        self.proxy = proxy
        self.rewards = rewards
        self.buffer = buffer
        self.tokenizer = tokenizer
        self.config = config
        self.seed = seed
        self.name = name
        self._filter = make_group_filter(config.filter)
        self._stops = PromptStops(tokenizer)
        self._live: dict[int, tuple[Prompt, list[str]]] = {}  # ticket id → (prompt, request ids)
        self._tasks: set[asyncio.Task[None]] = set()
        self.counts: dict[str, int] = {"requests": 0, "aborted_requests": 0, "failed_samples": 0}

    async def run(self) -> None:
        """Admit and produce groups until the buffer is closed; in-flight groups are cancelled on exit."""
        try:
            while True:
                if self.config.generation == "queue":
                    self._spawn(self._produce_group(*await admit(self.source, self.buffer, self.name)))
                else:
                    await self._produce_batch()
        except BufferClosedError:
            pass
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def abort_stale(self) -> int:
        """Abort the requests of admitted groups that can no longer be trained fresh; returns how many groups.

        Their generations come back with ``finish_reason="abort"`` and the groups are released as aborted,
        so redundant or straggling work stops holding engines (and, under the drain policy, weight updates).
        """
        stale = [a.ticket_id for a in self.buffer.untrainable_in_flight() if a.ticket_id in self._live]
        request_ids = [rid for ticket in stale for rid in self._live[ticket][1]]
        await asyncio.gather(*(self.proxy.abort(rid) for rid in request_ids))
        return len(stale)

    # ---- one group -------------------------------------------------------------------------------------

    async def _produce_group(self, admission: Admission, prompt: Prompt) -> None:
        try:
            trajectories = await asyncio.gather(
                *(self._sample(admission, prompt, i) for i in range(self.config.num_return_sequences))
            )
        except asyncio.CancelledError:  # shutdown: the prompt is not ended, a resumed run hands it out again
            self._end(admission, prompt, DropKind.ABORTED, "producer stopped", interrupted=True)
            raise
        except Exception as err:  # deliberate fault tolerance: an engine failure drops this group only
            self._end(admission, prompt, DropKind.FAILED, f"{type(err).__name__}: {err}")
            return
        self._finish_group(admission, prompt, list(trajectories))

    async def _sample(self, admission: Admission, prompt: Prompt, index: int) -> Trajectory:
        generation = await self._generate(admission, prompt, index)
        return await self._score(admission, prompt, index, generation)

    async def _generate(self, admission: Admission, prompt: Prompt, index: int) -> Generation:
        request = self._request(prompt, index)
        self._live.setdefault(admission.ticket_id, (prompt, []))[1].append(request.request_id)
        self.counts["requests"] += 1
        return await self.proxy.generate(request)

    async def _score(
        self, admission: Admission, prompt: Prompt, index: int, generation: Generation
    ) -> Trajectory:
        text = response_text(generation, self.tokenizer)
        if generation.finish_reason is FinishReason.ABORT:
            result = RewardResult(reward=0.0, status=RewardStatus.FAILED, reason="aborted")
        else:
            result = await self.rewards.score(text, prompt.sample)
        trajectory = build_trajectory(prompt, index, generation, text, result, admission.start_version)
        if result.placed is not None:
            response = rewards_on_tokens(result.placed, generation.token_ids, self._decode)
            trajectory.token_rewards = [0.0] * len(generation.prompt_token_ids) + response
        return trajectory

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def _finish_group(self, admission: Admission, prompt: Prompt, trajectories: list[Trajectory]) -> None:
        trainable = [t for t in trajectories if t.status.trainable]
        self.counts["failed_samples"] += sum(t.status is TrajectoryStatus.FAILED for t in trajectories)
        self.counts["aborted_requests"] += sum(t.status is TrajectoryStatus.ABORTED for t in trajectories)
        dropped = [(t.uid, t.status.value, t.reason) for t in trajectories if not t.status.trainable]
        if not trainable:
            kind = (
                DropKind.ABORTED
                if any(t.status is TrajectoryStatus.ABORTED for t in trajectories)
                else DropKind.FAILED
            )
            self._end(admission, prompt, kind, "; ".join(f"{uid}: {reason}" for uid, _, reason in dropped))
            return
        group = Group(prompt_uid=prompt.key, trajectories=trainable, metadata={"dropped_samples": dropped})
        if self._filter is not None and not self._filter(group):
            self._end(admission, prompt, DropKind.FILTERED, f"filter {self.config.filter!r} rejected it")
            return
        self._live.pop(admission.ticket_id, None)
        if not self.buffer.put(admission, group):
            self.source.finish(prompt.key)

    def _end(
        self, admission: Admission, prompt: Prompt, kind: DropKind, reason: str, *, interrupted: bool = False
    ) -> None:
        """Release the group's ticket; the prompt is ended, or (``interrupted``, at shutdown) left unfinished."""
        self._live.pop(admission.ticket_id, None)
        self.buffer.release(admission, kind, reason)
        if interrupted:
            self.source.interrupt(prompt.key)
        else:
            self.source.finish(prompt.key)

    # ---- the naive baseline ----------------------------------------------------------------------------

    async def _produce_batch(self) -> None:
        """``generation: batch``: admit a round of prompts (all that capacity allows, at most a batch plus the
        redundant prompts: over-sampling, so a round whose groups are partly filtered can still fill the batch;
        after filtering only the dropped groups' places are free), generate everything, then score everything."""
        limit = self.buffer.groups_per_batch + self.buffer.max_redundant_groups
        admitted = await admit_batch(self.source, self.buffer, self.name, limit)
        n = self.config.num_return_sequences
        try:
            generations = await asyncio.gather(
                *(self._generate(a, p, i) for a, p in admitted for i in range(n))
            )
        except Exception as err:  # deliberate fault tolerance: the failed step's groups are dropped, recorded
            for admission, prompt in admitted:
                self._end(admission, prompt, DropKind.FAILED, f"{type(err).__name__}: {err}")
            return
        trajectories = await asyncio.gather(
            *(
                self._score(a, p, i, generations[g * n + i])
                for g, (a, p) in enumerate(admitted)
                for i in range(n)
            )
        )
        for g, (admission, prompt) in enumerate(admitted):
            self._finish_group(admission, prompt, list(trajectories[g * n : (g + 1) * n]))

    # ---- helpers ---------------------------------------------------------------------------------------

    def _request(self, prompt: Prompt, index: int) -> Request:
        cfg = self.config
        prompt_ids = prompt_token_ids(prompt.sample, self.tokenizer)
        return Request(
            request_id=f"{prompt.key}#{index}",
            prompt_token_ids=prompt_ids,
            sampling=sampling_params(
                cfg, request_seed(self.seed, prompt.key, index), self._stops(prompt.sample)
            ),
            # Without replication the n responses stay together on one engine, like one grouped request.
            affinity_key=None if cfg.prompt_replication else prompt.key,
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def build_trajectory(
    prompt: Prompt, index: int, generation: Generation, text: str, result: RewardResult, admitted_version: int
) -> Trajectory:
    """A trajectory from a prompt and its generation: prompt tokens masked out, per-token log-probs and
    versions aligned with the full sequence, status from the finish reason and the reward outcome."""
    num_prompt = len(generation.prompt_token_ids)
    status, reason = _status(generation.finish_reason, result)
    return Trajectory(
        prompt_uid=prompt.key,
        sample_index=index,
        token_ids=generation.prompt_token_ids + generation.token_ids,
        loss_mask=RleSequence.from_runs([(0, num_prompt), (1, generation.num_tokens)]),
        logprobs=[0.0] * num_prompt + generation.logprobs,
        versions=[-1] * num_prompt + generation.versions,
        start_version=generation.versions[0] if generation.versions else admitted_version,
        num_prompt_tokens=num_prompt,
        reward=result.reward,
        status=status,
        reason=reason,
        response_text=text,
        info=dict(result.info),
        timings={**generation.timings, "reward_s": result.elapsed_s, "finished_at": time.monotonic()},
    )


def _status(finish_reason: FinishReason, result: RewardResult) -> tuple[TrajectoryStatus, str]:
    if finish_reason is FinishReason.ABORT:
        return TrajectoryStatus.ABORTED, "generation aborted"
    if not result.ok:
        return TrajectoryStatus.FAILED, result.reason
    if finish_reason is FinishReason.LENGTH:
        return TrajectoryStatus.TRUNCATED, "hit max_new_tokens"
    return TrajectoryStatus.COMPLETED, ""
