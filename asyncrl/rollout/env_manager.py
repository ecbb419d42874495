"""EnvManager: one environment slot running ``reset → (generate → env.step)* → reward`` episodes.

Key decision: the episode loop awaits only its own generation and its own env step, so an env steps the
moment its response is ready and a slow env holds up nobody else (environment-level async rollout). The
``batch`` baseline adds two ``Lockstep`` waits per turn, making every episode of a round wait for the others.
An env whose reset or step raises or overruns ``step_timeout_s`` fails its episode (recorded, with the
reason) and is replaced by a fresh instance before the slot's next episode.

Episode lifecycle: running → completed (env terminated) | truncated (env truncated, max_turns or context
limit) | failed (env or engine error) | aborted (its
group was cut: enough trajectories already, or it can no longer be trained fresh).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from asyncrl.config.env import EnvManagerConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.envs.base import Env
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.lockstep import Lockstep
from asyncrl.rollout.rlvr_producer import GenerateClient, request_seed, response_text, sampling_params
from asyncrl.rollout.turns import Turns, make_turns
from asyncrl.types import FinishReason, Generation, PlacedRewards, Request, Trajectory, TrajectoryStatus

T = TypeVar("T")


class EnvFailure(Exception):
    """An env call raised or timed out; the message is the reason recorded on the trajectory."""


class GenerationFailure(Exception):
    """The proxy failed to serve a turn's request; the episode fails, its env stays."""


class EpisodeCut(Exception):
    """The episode's group was cut while it ran; the message is the group's reason."""


def env_seed(run_seed: int, prompt_key: str) -> int:
    """The seed every env of a group resets with, from (run seed, prompt key): the same in any schedule."""
    digest = hashlib.blake2b(f"{run_seed}\0env\0{prompt_key}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


class GroupControl:
    """What the episodes of one group share: the lockstep (batch stepping) and the means to cut them all."""

    def __init__(self, proxy: GenerateClient, lockstep: Lockstep | None) -> None:
        self.proxy = proxy
        self.lockstep = lockstep
        self.cut_reason: str | None = None
        self.live_requests: set[str] = set()
        self.env_calls: set[asyncio.Task[Any]] = set()

    async def sync(self) -> None:
        """Wait for the other episodes of the round (batch stepping); a no-op under async stepping."""
        if self.lockstep is not None:
            await self.lockstep.wait()

    def check(self) -> None:
        if self.cut_reason is not None:
            raise EpisodeCut(self.cut_reason)

    async def cut(self, reason: str) -> None:
        """Stop every running episode: env calls are cancelled, in-flight requests aborted."""
        if self.cut_reason is None:
            self.cut_reason = reason
        for task in list(self.env_calls):
            task.cancel()
        await asyncio.gather(*(self.proxy.abort(rid) for rid in list(self.live_requests)))


def checked_reward(reward: Any) -> float | PlacedRewards:
    """An env step's reward, or ``EnvFailure`` saying why it cannot be one (the episode fails, the env is
    replaced, as for any env fault)."""
    if isinstance(reward, PlacedRewards):
        return reward
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise EnvFailure(f"env step returned reward {reward!r}: a finite number or PlacedRewards is needed")
    return float(reward)


class EnvManager:
    """One env slot; ``run_episode`` plays one episode on it and always returns its trajectory."""

    def __init__(
        self,
        *,
        make_env: Callable[[], Env],
        proxy: GenerateClient,
        tokenizer: Any,
        rollout: RolloutConfig,
        config: EnvManagerConfig,
        seed: int,
    ) -> None:
        self.make_env = make_env
        self.env = make_env()
        self.proxy = proxy
        self.tokenizer = tokenizer
        self.rollout = rollout
        self.config = config
        self.seed = seed
        self.num_replacements = 0
        self.turns: Turns = make_turns(config.chat_format, tokenizer)
        self._last_generation: Generation | None = None

    async def run_episode(self, episode: Episode, group: GroupControl) -> Trajectory:
        """Play ``episode``; under batch stepping the producer has joined it to the lockstep already."""
        try:
            await self._play(episode, group)
        except EnvFailure as err:
            episode.end(TrajectoryStatus.FAILED, str(err))
            self._replace_env()
        except GenerationFailure as err:
            episode.end(TrajectoryStatus.FAILED, str(err))
        except EpisodeCut as cut:
            episode.end(TrajectoryStatus.ABORTED, str(cut))
        finally:
            if group.lockstep is not None:
                group.lockstep.leave()
        return episode.trajectory()

    async def _play(self, episode: Episode, group: GroupControl) -> None:
        """The episode loop: reset, then generate and step until the episode ends."""
        observation, _ = await self._env_call(group, episode, lambda: self.env.reset(episode.env_seed))
        self.turns = make_turns(self.config.chat_format, self.tokenizer)
        episode.start(self.turns.first(observation, getattr(self.env, "tools", None)))
        while episode.status is None:
            await group.sync()
            await self._generate(episode, group)
            await group.sync()
            result = await self._env_call(group, episode, lambda: self.env.step(episode.responses[-1]))
            episode.credit_turn(checked_reward(result.reward), self._decode)
            self._after_step(episode, result.terminated, result.truncated, result.observation)

    def _after_step(self, episode: Episode, terminated: bool, truncated: bool, observation: str) -> None:
        if terminated:
            episode.end(TrajectoryStatus.COMPLETED)
        elif truncated:
            episode.end(TrajectoryStatus.TRUNCATED, "env truncated the episode")
        elif episode.num_turns >= self.config.max_turns:
            episode.end(TrajectoryStatus.TRUNCATED, f"reached env_manager.max_turns={self.config.max_turns}")
        else:
            last = self._last_generation
            stopped = last is not None and last.finish_reason is FinishReason.STOP
            response_ids = list(last.token_ids) if last is not None else []
            episode.add_observation(
                self.turns.after(response_ids, episode.responses[-1], stopped, observation)
            )
            if len(episode.token_ids) + self.rollout.max_new_tokens > self.config.max_context_tokens:
                episode.end(
                    TrajectoryStatus.TRUNCATED, "next turn would exceed env_manager.max_context_tokens"
                )

    async def _generate(self, episode: Episode, group: GroupControl) -> None:
        group.check()
        request = self._request(episode)
        group.live_requests.add(request.request_id)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            generation = await self.proxy.generate(request)
        except Exception as err:  # deliberate fault tolerance: an engine failure fails this episode only
            raise GenerationFailure(f"generation {request.request_id}: {type(err).__name__}: {err}") from err
        finally:
            group.live_requests.discard(request.request_id)
            episode.timings["generate_s"] += loop.time() - started
        if generation.finish_reason is FinishReason.ABORT:
            raise EpisodeCut(group.cut_reason or f"request {request.request_id} aborted")
        self._last_generation = generation
        episode.add_response(generation, response_text(generation, self.tokenizer))

    async def _env_call(self, group: GroupControl, episode: Episode, call: Callable[[], Awaitable[T]]) -> T:
        """Run one env call as a task the group can cancel, under the step timeout (``call`` makes the
        coroutine only once the group is known not to be cut)."""
        group.check()
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.ensure_future(call())
        group.env_calls.add(task)
        try:
            await asyncio.wait({task}, timeout=self.config.step_timeout_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            group.env_calls.discard(task)
            episode.timings["env_s"] += loop.time() - started
        return self._env_outcome(task, group)

    def _env_outcome(self, task: asyncio.Task[T], group: GroupControl) -> T:
        if not task.done():
            task.cancel()
            raise EnvFailure(
                f"env call timed out after env_manager.step_timeout_s={self.config.step_timeout_s}s"
            )
        if task.cancelled():
            raise EpisodeCut(group.cut_reason or "env call cancelled")
        error = task.exception()
        if error is not None:
            raise EnvFailure(f"env failed: {type(error).__name__}: {error}")
        return task.result()

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def _replace_env(self) -> None:
        self.env = self.make_env()
        self.num_replacements += 1

    def _request(self, episode: Episode) -> Request:
        turn_key = f"{episode.prompt_key}#{episode.num_turns}"
        return Request(
            request_id=f"{episode.uid}.{episode.num_turns}",
            prompt_token_ids=list(episode.token_ids),
            sampling=sampling_params(
                self.rollout, request_seed(self.seed, turn_key, episode.index), self.turns.stop_token_ids
            ),
            affinity_key=episode.uid,
        )
