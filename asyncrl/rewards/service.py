"""The reward service: runs reward functions concurrently with a per-call timeout, never raising.

Key decision: every call ends in a ``RewardResult`` (ok, or failed with the reason), so one bad sample can
never stop a run. Calls run in a thread or process pool. A timed-out call's pool is replaced, so the hung
call holds up nothing else; in a process pool its workers are killed, while a thread cannot be stopped and
runs on in the background (a reward that may never return belongs in ``executor: process``). Calls caught
in a retired pool are re-run once on the new one (rewards are pure, so re-running is safe). The timeout
counts from submission, queueing included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import enum
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.reward import RewardConfig
from asyncrl.data.base import TaskSample
from asyncrl.rewards.registry import RewardFn, get_reward
from asyncrl.types import PlacedRewards


class RewardStatus(str, enum.Enum):
    """Outcome of one reward call: ok, or failed (raised, timed out, or returned something invalid)."""

    OK = "ok"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class RewardResult:
    """The reward of one response; ``reward`` is 0.0 when ``status`` is FAILED, ``reason`` says why."""

    reward: float
    status: RewardStatus
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    placed: PlacedRewards | None = None
    """Where in the response the reward fell, when the function placed it (``reward`` is its total)."""

    @property
    def ok(self) -> bool:
        return self.status is RewardStatus.OK


class ConfiguredReward:
    """The reward a config asks for: a named function (or each sample's own) plus ``format_weight`` × format.

    A picklable callable (names and the config, not functions, travel) so process pools can run it; the
    functions it builds (a sandbox for ``code``) are kept per process, built on first use.
    """

    def __init__(
        self, name: str = "", format_weight: float = 0.0, config: RewardConfig | None = None
    ) -> None:
        self.name = name
        self.format_weight = format_weight
        self.config = config or RewardConfig()
        self._built: dict[str, RewardFn] = {}
        self._lock = threading.Lock()
        if name:
            self._reward(name)  # fail at construction, not on the first sample

    def __call__(
        self, response_text: str, sample: TaskSample
    ) -> tuple[float | PlacedRewards, dict[str, Any]]:
        reward, info = as_reward_and_info(self._reward(self.name or sample.reward)(response_text, sample))
        if self.format_weight:
            format_score, _ = as_reward_and_info(self._reward("format")(response_text, sample))
            info = {**info, "format": total_reward(format_score)}
            reward = with_reward_at_end(
                reward, self.format_weight * total_reward(format_score), response_text
            )
        return reward, info

    def _reward(self, name: str) -> RewardFn:
        with self._lock:
            if name not in self._built:
                self._built[name] = get_reward(name, self.config)
            return self._built[name]

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "format_weight": self.format_weight, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A process-pool copy builds its functions lazily (a ``code`` reward: a sandbox per copy).
        self.__dict__.update(state, _built={}, _lock=threading.Lock())


def make_reward_fn(config: RewardConfig) -> ConfiguredReward:
    """The reward function described by ``config`` (``reward.name``, ``reward.format_weight``, ``reward.code``)."""
    return ConfiguredReward(config.name, config.format_weight, config)


def as_reward_and_info(output: Any) -> tuple[float | PlacedRewards, dict[str, Any]]:
    """Normalise a reward function's output to (finite float or ``PlacedRewards``, info dict); ValueError if it
    is none of the forms."""
    reward, info = output if isinstance(output, tuple) and len(output) == 2 else (output, {})
    if not isinstance(reward, PlacedRewards) and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise ValueError(f"reward must be a finite number or PlacedRewards, got {reward!r}")
    if not isinstance(info, dict):
        raise ValueError(f"reward info must be a dict, got {type(info).__name__}")
    return (reward if isinstance(reward, PlacedRewards) else float(reward)), info


def total_reward(reward: float | PlacedRewards) -> float:
    return reward.total if isinstance(reward, PlacedRewards) else float(reward)


def with_reward_at_end(reward: float | PlacedRewards, extra: float, text: str) -> float | PlacedRewards:
    """``reward`` plus ``extra`` credited to the text's last token (a float stays a float)."""
    if isinstance(reward, PlacedRewards):
        return PlacedRewards(reward.points + ((len(text), extra),))
    return reward + extra


class RewardService:
    """Scores (response, sample) pairs concurrently; ``score`` always returns a ``RewardResult``."""

    def __init__(
        self, reward_fn: RewardFn, *, timeout_s: float, executor: str = "thread", max_workers: int = 2
    ) -> None:
        if executor not in ("thread", "process"):
            raise ValueError(f"reward.executor must be 'thread' or 'process', got {executor!r}")
        self._fn = reward_fn
        self._timeout_s = timeout_s
        self._executor_kind = executor
        self._max_workers = max_workers
        self._pool = self._new_pool()
        self.counts = {"scored": 0, "failed": 0, "timed_out": 0}
        """Calls so far: all, failed (raised or invalid output), timed out; a run reports them per step."""
        self.on_scored: Callable[[float], None] | None = None
        """Called with each call's duration as it ends, ok or failed (the run timeline's reward spans)."""

    @classmethod
    def from_config(cls, config: RewardConfig) -> RewardService:
        """A service running the reward ``config`` describes."""
        return cls(
            make_reward_fn(config),
            timeout_s=config.timeout_s,
            executor=config.executor,
            max_workers=config.max_workers,
        )

    async def score(self, response_text: str, sample: TaskSample) -> RewardResult:
        """The reward of one response; failures and timeouts come back as FAILED results with the reason."""
        result = await self._score(response_text, sample)
        if self.on_scored is not None:
            self.on_scored(result.elapsed_s)
        return result

    async def _score(self, response_text: str, sample: TaskSample) -> RewardResult:
        start = time.perf_counter()
        try:
            output = await self._run_with_timeout(response_text, sample)
            reward, info = as_reward_and_info(output)
        except asyncio.TimeoutError:
            self.counts["timed_out"] += 1
            return _failed(f"reward timed out after {self._timeout_s:g}s", start, sample)
        except Exception as err:  # deliberate fault tolerance: any reward error fails only this sample
            self.counts["failed"] += 1
            return _failed(f"reward raised {type(err).__name__}: {err}", start, sample)
        finally:
            self.counts["scored"] += 1
        return RewardResult(
            reward=total_reward(reward),
            status=RewardStatus.OK,
            info=info,
            elapsed_s=time.perf_counter() - start,
            placed=reward if isinstance(reward, PlacedRewards) else None,
        )

    async def score_many(self, pairs: Sequence[tuple[str, TaskSample]]) -> list[RewardResult]:
        """Rewards of many responses, computed concurrently, in the order given."""
        return list(await asyncio.gather(*(self.score(text, sample) for text, sample in pairs)))

    def score_many_sync(self, pairs: Sequence[tuple[str, TaskSample]]) -> list[RewardResult]:
        """``score_many`` for callers without an event loop (evaluation scripts, SFT)."""
        return asyncio.run(self.score_many(pairs))

    def close(self) -> None:
        """Stop the pool; running calls are abandoned (their workers are killed in process mode)."""
        self._retire(self._pool)

    def __enter__(self) -> RewardService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _run_with_timeout(self, response_text: str, sample: TaskSample) -> Any:
        for attempt in range(2):
            pool = self._pool
            call = pool.submit(self._fn, response_text, sample)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(call), self._timeout_s)
            except asyncio.TimeoutError:
                self._replace(pool)
                raise
            except (asyncio.CancelledError, BrokenProcessPool):
                # Re-run once if another call's timeout retired this pool under us; anything else propagates.
                retired_under_us = pool is not self._pool and (call.cancelled() or call.done())
                if attempt == 1 or not retired_under_us:
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _replace(self, pool: cf.Executor) -> None:
        """Swap in a fresh pool if ``pool`` is still the current one, then retire the old one."""
        if pool is self._pool:
            self._pool = self._new_pool()
            self._retire(pool)

    def _new_pool(self) -> cf.Executor:
        if self._executor_kind == "process":
            return cf.ProcessPoolExecutor(max_workers=self._max_workers)
        return cf.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="reward")

    @staticmethod
    def _retire(pool: cf.Executor) -> None:
        if isinstance(pool, cf.ProcessPoolExecutor):
            # A hung worker cannot be cancelled; ProcessPoolExecutor has no public kill, so terminate its
            # processes (it would otherwise block interpreter exit joining them).
            for process in list((pool._processes or {}).values()):
                process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)


def _failed(reason: str, start: float, sample: TaskSample) -> RewardResult:
    return RewardResult(
        reward=0.0,
        status=RewardStatus.FAILED,
        reason=f"sample {sample.uid}: {reason}",
        elapsed_s=time.perf_counter() - start,
    )
