"""Evaluation during training: held-out sets scored every ``controller.eval_every`` steps through the same proxy
and engines as rollout, logged with the step's metrics.

::

    Controller._step: train → sync weights (version v = step) → after_sync(v) → on_step (metrics line)
                                                                   │
             due (v % eval_every == 0, short of the last step) ───┤ launch: every set's answers through
                                                                   │ EvalProxy (≤ max_in_flight at once)
           sync mode / last step: awaited here (a barrier) ◄───────┤ async modes: runs beside rollout;
                                                                   ▼ lands in the line of the step it ends in
                            ``eval/<set>/...`` + ``eval/<set>/step`` (launched after) and the versions that
                            generated its tokens (``policy_version_min`` / ``policy_version_max``)

Key decisions:
- Rollout never stops for it in the async modes: evaluation holds at most ``controller.eval_share`` of the
  engines' request slots (a semaphore in front of the proxy), and the controller does not wait for it. Its
  answers may therefore come from later versions than the one it was launched after (a weight update lands
  while it runs, and under the drain policy a request waits while its engine drains for an update); each
  answer still comes from one version there, and the line names the versions that answered, so a curve is
  never silently mislabelled.
  ``sync`` evaluates at its barrier instead: exactly the version just synced, every answer.
- Before and after training the sets are scored too (``evaluate_now``, into ``summary.json``), with nothing
  else running: exactly the first and the last version, the two ends of every curve.
- Resume: an evaluation still running at a checkpoint is listed in it (``pending_steps``); a run resumed from
  that checkpoint evaluates once at once, on the resumed weights (their version in the line), so no launched
  evaluation vanishes without a line; lines after the checkpoint's step are cut with the rest of the metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.config.controller import EvalSetConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.run import RunConfig
from asyncrl.controller.evaluation import ScoredAnswer, evaluate_env, score_answers
from asyncrl.data.base import Task, TaskSample
from asyncrl.data.registry import make_task
from asyncrl.envs import env_factory
from asyncrl.modes import mode_spec
from asyncrl.rollout.rlvr_producer import GenerateClient
from asyncrl.types import Generation, Request


class EvalProxy:
    """The proxy as one evaluation sees it: at most ``limit`` of its requests in flight at once (shared by every
    evaluation running), request ids under the evaluation's ``tag`` (two evaluations may overlap), and the
    policy versions of every token it got back recorded."""

    def __init__(self, proxy: GenerateClient, limit: asyncio.Semaphore, tag: str) -> None:
        self.proxy = proxy
        self.limit = limit
        self.tag = tag
        self.versions: list[int] = []

    async def generate(self, request: Request) -> Generation:
        async with self.limit:
            generation = await self.proxy.generate(replace(request, request_id=self._id(request.request_id)))
        self.versions += [min(generation.versions), max(generation.versions)] if generation.versions else []
        return replace(generation, request_id=request.request_id)

    async def abort(self, request_id: str) -> Generation | None:
        return await self.proxy.abort(self._id(request_id))

    def _id(self, request_id: str) -> str:
        return f"{self.tag}/{request_id}"


@dataclass
class EvalSet:
    """One set as it is scored: its config and its prompts (None: agentic, held-out env episodes)."""

    config: EvalSetConfig
    samples: list[TaskSample] | None
    max_new_tokens: int


EpisodeEval = Callable[[EvalProxy, EvalSet, Any], Awaitable[dict[str, float]]]
"""Agentic runs: ``(proxy, set, tokenizer)`` → ``evaluate_env``'s metrics of ``set.config.size`` held-out
episodes."""


@dataclass
class PeriodicEvaluation:
    """Launches, bounds and collects the evaluations of one run (contract: module docstring)."""

    sets: Sequence[EvalSet]
    every: int
    last_step: int
    barrier: bool
    max_in_flight: int
    proxy: GenerateClient
    tokenizer: Any
    rewards: Any
    seed: int
    rollout: RolloutConfig
    """The run's rollout sampling, which every set's answers follow but for its temperature and length."""
    episodes: EpisodeEval | None = None
    running: dict[int, asyncio.Task[dict[str, float]]] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._limit = asyncio.Semaphore(self.max_in_flight)

    def due(self, step: int) -> bool:
        """Every ``every`` steps, short of the last (the run's evaluation after training scores the sets)."""
        return self.every > 0 and step % self.every == 0 and step < self.last_step

    async def after_sync(self, step: int) -> None:
        """The controller's hook once the engines serve version ``step``: launch if due, after the previous
        evaluation has finished (one result per set per line; the wait is logged as ``time/eval_wait_s``);
        wait for it where the mode has a barrier, and at the last step for whatever still runs."""
        if self.due(step):
            started = asyncio.get_running_loop().time()
            await self.wait()
            self.finished["time/eval_wait_s"] = asyncio.get_running_loop().time() - started
            self.launch(step)
        if self.barrier or step >= self.last_step:
            await self.wait()

    async def evaluate_now(self, step: int) -> dict[str, float]:
        """Every set scored at once at version ``step`` (the run's evaluation before and after training)."""
        return await self._evaluate(step)

    def launch(self, step: int) -> None:
        if step not in self.running:
            self.running[step] = asyncio.ensure_future(self._evaluate(step))

    async def wait(self) -> None:
        """Until every running evaluation has finished (their metrics then wait in ``finished``)."""
        while self.running:
            await asyncio.wait(list(self.running.values()))
            self._collect()

    def take_finished(self) -> dict[str, float]:
        """The metrics of every evaluation finished since the last call (for the current step's line)."""
        self._collect()
        metrics, self.finished = self.finished, {}
        return metrics

    def pending_steps(self) -> list[int]:
        """Steps whose evaluation is still running (a checkpoint records them)."""
        return sorted(step for step, task in self.running.items() if not task.done())

    async def close(self) -> None:
        """Cancel what still runs (a stopped run); its steps stay in the checkpoint's ``pending_steps``."""
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        self.running.clear()

    def _collect(self) -> None:
        for step, task in list(self.running.items()):
            if task.done():
                del self.running[step]
                self.finished |= task.result()  # an evaluation that raised fails the run here, named

    async def _evaluate(self, step: int) -> dict[str, float]:
        results = await asyncio.gather(*(self._evaluate_set(step, s) for s in self.sets))
        return {key: value for metrics in results for key, value in metrics.items()}

    async def _evaluate_set(self, step: int, eval_set: EvalSet) -> dict[str, float]:
        proxy = EvalProxy(self.proxy, self._limit, f"eval@{step}/{eval_set.config.name}")
        loop = asyncio.get_running_loop()
        started = loop.time()
        if eval_set.samples is None:
            assert self.episodes is not None, "an agentic run evaluates episodes"
            metrics = episode_metrics(await self.episodes(proxy, eval_set, self.tokenizer))
        else:
            answers = await score_answers(
                proxy,
                self.tokenizer,
                eval_set.samples,
                self.rewards,
                rollout=self.rollout,
                temperature=eval_set.config.temperature,
                max_new_tokens=eval_set.max_new_tokens,
                seed=self.seed,
                samples_per_prompt=eval_set.config.samples_per_prompt,
            )
            metrics = answer_metrics(answers, eval_set.config)
        versions = proxy.versions or [-1]
        metrics |= {
            "step": float(step),
            "policy_version_min": float(min(versions)),
            "policy_version_max": float(max(versions)),
            "time_s": loop.time() - started,
        }
        return {f"eval/{eval_set.config.name}/{key}": value for key, value in metrics.items()}


def answer_metrics(answers: Sequence[ScoredAnswer], config: EvalSetConfig) -> dict[str, float]:
    """mean@k (mean reward of every answer), pass@k (share of prompts with an answer earning ``pass_reward``),
    pass@1 (the share of answers that pass: pass@1's unbiased estimate from k draws), and the rest."""
    k = config.samples_per_prompt
    by_prompt: dict[int, list[ScoredAnswer]] = {}
    for answer in answers:
        by_prompt.setdefault(answer.prompt_index, []).append(answer)
    passed = [answer.reward >= config.pass_reward for answer in answers]
    metrics = {
        f"mean@{k}": sum(a.reward for a in answers) / len(answers),
        f"pass@{k}": sum(any(a.reward >= config.pass_reward for a in group) for group in by_prompt.values())
        / len(by_prompt),
        "pass@1": sum(passed) / len(passed),
        "failed": float(sum(not a.ok for a in answers)),
        "response_length_mean": sum(a.num_tokens for a in answers) / len(answers),
        "num_prompts": float(len(by_prompt)),
    }
    return metrics


def episode_metrics(evaluated: dict[str, float]) -> dict[str, float]:
    """``evaluate_env``'s metrics under a set's names (one episode per seed: mean@1)."""
    names = {"eval/reward_mean": "mean@1", "eval/num_prompts": "num_prompts"}
    return {names.get(key, key.removeprefix("eval/")): value for key, value in evaluated.items()}


def periodic_evaluation(
    config: RunConfig, proxy: GenerateClient, tokenizer: Any, task: Task | None, rewards: Any
) -> PeriodicEvaluation | None:
    """The evaluation during training ``config.controller`` asks for (None when ``eval_every`` is 0), over the
    run's proxy."""
    controller = config.controller
    if controller.eval_every == 0:
        return None
    slots = config.rollout.num_engines * config.engine.slots()
    barrier = not mode_spec(controller.mode).rollout_overlaps_training
    return PeriodicEvaluation(
        sets=[_eval_set(config, set_config, task) for set_config in controller.periodic_eval_sets()],
        every=controller.eval_every,
        last_step=controller.num_steps,
        barrier=barrier,
        max_in_flight=slots if barrier else max(1, int(controller.eval_share * slots)),
        proxy=proxy,
        tokenizer=tokenizer,
        rewards=rewards,
        seed=config.seed,
        rollout=config.rollout,
        episodes=_episodes(config) if config.producer == "agentic" else None,
    )


def _eval_set(config: RunConfig, set_config: EvalSetConfig, task: Task | None) -> EvalSet:
    max_new_tokens = set_config.max_new_tokens or config.rollout.max_new_tokens
    if config.producer == "agentic":
        return EvalSet(set_config, None, max_new_tokens)
    source = make_task(set_config.task) if set_config.task is not None else task
    assert source is not None, "an rlvr run has a task"
    samples = list(source.split("eval"))[: set_config.size]
    if not samples:
        raise ValueError(f"controller.eval_sets[{set_config.name}]: the task's eval split is empty")
    return EvalSet(set_config, samples, max_new_tokens)


def _episodes(config: RunConfig) -> EpisodeEval:
    assert config.env is not None and config.env_manager is not None  # RunConfig fills them for agentic
    make_env = env_factory(config.env)

    async def episodes(proxy: EvalProxy, eval_set: EvalSet, tokenizer: Any) -> dict[str, float]:
        return await evaluate_env(
            proxy,
            tokenizer,
            make_env=make_env,
            rollout=config.rollout,
            manager=config.env_manager,
            num_episodes=eval_set.config.size,
            temperature=eval_set.config.temperature,
            max_new_tokens=eval_set.max_new_tokens,
            seed=config.seed,
        )

    return episodes


async def evaluate_sets(
    config: RunConfig, proxy: GenerateClient, tokenizer: Any, task: Task | None, rewards: Any, step: int
) -> dict[str, float]:
    """The run's eval sets scored once at version ``step`` ({} when ``eval_every`` is 0)."""
    evaluation = periodic_evaluation(config, proxy, tokenizer, task, rewards)
    return await evaluation.evaluate_now(step) if evaluation else {}


def is_set_metric(key: str) -> bool:
    """Whether ``key`` is an eval set's metric (``eval/<set>/<name>``), not the run's ``eval/<name>``."""
    return key.startswith("eval/") and key.count("/") >= 2
