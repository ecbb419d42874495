"""Held-out evaluation through the same proxy and engines that serve rollouts.

Key decision: one seeded sample per prompt (or one episode per held-out env seed, agentic runs) at the
configured temperature (1 by default), so the number is the policy's expected reward — the quantity RL
optimises — and before/after numbers of one run are comparable: the same prompts, seeds and sampling seeds.
Evaluation's own settings are the temperature and the answer length; everything else is sampled as the run's
rollouts are (``rollout.top_p``, ``top_k``, ``stop_strings``, and a templated prompt's end-of-turn token), so the
reward parses answers cut exactly as in training and the policy scored is the one rollouts sample.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from asyncrl.config.env import EnvManagerConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.run import RunConfig
from asyncrl.data.base import Task, TaskSample, prompt_token_ids
from asyncrl.envs import env_factory
from asyncrl.envs.base import Env
from asyncrl.metrics.progress import Progress
from asyncrl.rewards.service import RewardService
from asyncrl.rollout.env_manager import EnvManager, GroupControl, env_seed
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.rlvr_producer import GenerateClient, request_seed, sampling_params
from asyncrl.serve.chat_format import PromptStops
from asyncrl.types import Request, Trajectory, TrajectoryStatus


async def evaluate_run(
    config: RunConfig,
    proxy: GenerateClient,
    tokenizer: Any,
    task: Task | None,
    rewards: RewardService,
    tag: str = "eval",
    progress: Progress | None = None,
) -> dict[str, float]:
    """The held-out evaluation ``config`` asks for: the first ``controller.eval_prompts`` prompts of the task's eval
    split, or as many held-out env episodes for agentic runs ({} when ``eval_prompts`` is 0)."""
    controller = config.controller
    if (
        controller.eval_prompts == 0 or config.producer == "external"
    ):  # external harnesses evaluate themselves
        return {}
    if config.producer == "agentic":
        assert config.env is not None and config.env_manager is not None  # RunConfig fills them for agentic
        return await evaluate_env(
            proxy,
            tokenizer,
            make_env=env_factory(config.env),
            rollout=config.rollout,
            manager=config.env_manager,
            num_episodes=controller.eval_prompts,
            temperature=controller.eval_temperature,
            max_new_tokens=config.rollout.max_new_tokens,
            seed=config.seed,
            progress=progress,
        )
    assert task is not None, "an rlvr run is evaluated on its task"
    answers = await score_answers(
        proxy,
        tokenizer,
        list(task.split("eval"))[: controller.eval_prompts],
        rewards,
        rollout=config.rollout,
        temperature=controller.eval_temperature,
        max_new_tokens=config.rollout.max_new_tokens,
        seed=config.seed,
        tag=tag,
        progress=progress,
    )
    return summary_metrics(answers)


@dataclass(frozen=True)
class ScoredAnswer:
    """One sampled answer to a held-out prompt, scored."""

    prompt_index: int
    reward: float
    ok: bool
    """False when the reward failed (timeout, error): the reward is then 0."""
    num_tokens: int


def eval_sampling(rollout: RolloutConfig, temperature: float, max_new_tokens: int) -> RolloutConfig:
    """The run's rollout sampling with evaluation's own two settings (module docstring): the one place both
    evaluations, prompts and env episodes, take their sampling from, so an eval set's length and temperature
    mean the same in either."""
    return replace(rollout, temperature=temperature, max_new_tokens=max_new_tokens)


async def score_answers(
    proxy: GenerateClient,
    tokenizer: Any,
    samples: Sequence[TaskSample],
    rewards: RewardService,
    *,
    rollout: RolloutConfig,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    tag: str = "eval",
    samples_per_prompt: int = 1,
    progress: Progress | None = None,
) -> list[ScoredAnswer]:
    """``samples_per_prompt`` answers to each sample, all requested at once (the proxy queues them), each
    seeded by (run seed, prompt uid, answer index), so the same prompts give the same draws at every step.

    Sampled as ``rollout`` samples (``sampling_params``: top-p, top-k, stop strings, end-of-turn stop) but at
    evaluation's own ``temperature`` and ``max_new_tokens`` (``eval_sampling``)."""
    done = Counter(progress)
    stops = PromptStops(tokenizer)
    sampling = eval_sampling(rollout, temperature, max_new_tokens)

    async def one(index: int, sample: TaskSample, draw: int) -> ScoredAnswer:
        request = Request(
            request_id=f"{tag}:{sample.uid}" + (f":{draw}" if draw else ""),
            prompt_token_ids=prompt_token_ids(sample, tokenizer),
            sampling=sampling_params(sampling, request_seed(seed, sample.uid, draw), stops(sample)),
        )
        generation = await proxy.generate(request)
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        result = await rewards.score(text, sample)
        done.one()
        return ScoredAnswer(index, result.reward, result.ok, generation.num_tokens)

    draws = [(i, s, d) for i, s in enumerate(samples) for d in range(samples_per_prompt)]
    return list(await asyncio.gather(*(one(*draw) for draw in draws)))


def summary_metrics(answers: Sequence[ScoredAnswer]) -> dict[str, float]:
    """Mean reward, failure count and mean response length of one answer per held-out prompt."""
    return {
        "eval/reward_mean": sum(a.reward for a in answers) / len(answers),
        "eval/failed": float(sum(not a.ok for a in answers)),
        "eval/response_length_mean": sum(a.num_tokens for a in answers) / len(answers),
        "eval/num_prompts": float(len(answers)),
    }


async def evaluate_env(
    proxy: GenerateClient,
    tokenizer: Any,
    *,
    make_env: Callable[[], Env],
    rollout: RolloutConfig,
    manager: EnvManagerConfig,
    num_episodes: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    progress: Progress | None = None,
) -> dict[str, float]:
    """Mean episode return, failures, model tokens and turns of one episode per held-out env seed.

    The seeds come from the keys ``eval0``, ``eval1``, …, which no training admission uses (those are
    ``env<slot>@<epoch>``); episodes run with ``manager``'s turn, context and timeout limits. Every turn is
    sampled as ``score_answers`` samples (``eval_sampling``): at most ``max_new_tokens`` per turn, which is also
    the length the context check reserves for the next turn."""
    sampling = eval_sampling(rollout, temperature, max_new_tokens)
    done = Counter(progress)

    async def one(index: int) -> Trajectory:
        key = f"eval{index}"
        episode = Episode(key, 0, env_seed(seed, key), admitted_version=0)
        env_manager = EnvManager(
            make_env=make_env, proxy=proxy, tokenizer=tokenizer, rollout=sampling, config=manager, seed=seed
        )
        trajectory = await env_manager.run_episode(episode, GroupControl(proxy, lockstep=None))
        done.one()
        return trajectory

    episodes = await asyncio.gather(*(one(i) for i in range(num_episodes)))
    return {
        "eval/reward_mean": sum(t.reward for t in episodes) / num_episodes,
        "eval/failed": float(sum(t.status is TrajectoryStatus.FAILED for t in episodes)),
        "eval/response_length_mean": sum(t.num_response_tokens for t in episodes) / num_episodes,
        "eval/turns_mean": sum(t.info["turns"] for t in episodes) / num_episodes,
        "eval/num_prompts": float(num_episodes),
    }


class Counter:
    """Counts finished evaluation items into an optional ``Progress``."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.done = 0

    def one(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress.update(self.done)
