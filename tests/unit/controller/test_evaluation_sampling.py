"""Held-out evaluation samples as the run's rollouts do (``rollout.top_p``, ``top_k``, ``stop_strings``), at its
own temperature and answer length: the reward parses an answer cut where training cuts it, and the policy
scored is the one rollouts sample. Both paths are checked: the before/after evaluation (``controller.eval_*``)
and the eval sets (``controller.eval_sets``)."""

from __future__ import annotations

import asyncio

from controller_harness import FakeTokenizer

from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.controller.evaluation import evaluate_run
from asyncrl.controller.periodic_eval import evaluate_sets
from asyncrl.data.base import TaskSample
from asyncrl.data.registry import make_task
from asyncrl.rewards.service import RewardResult, RewardStatus
from asyncrl.types import FinishReason, Generation, Request, SamplingParams


class Recording:
    """A proxy that answers every request with one token and keeps each request's sampling."""

    def __init__(self) -> None:
        self.sampling: list[SamplingParams] = []

    async def generate(self, request: Request) -> Generation:
        self.sampling.append(request.sampling)
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=[1],
            logprobs=[-0.1],
            versions=[0],
            finish_reason=FinishReason.STOP,
        )


class Rewards:
    async def score(self, text: str, sample: TaskSample) -> RewardResult:
        return RewardResult(reward=1.0, status=RewardStatus.OK)


def run_config() -> RunConfig:
    return load_run_config(
        None,
        [
            "rollout.stop_strings=['</answer>', '####']",
            "rollout.top_p=0.9",
            "rollout.top_k=7",
            "rollout.temperature=0.8",
            "rollout.max_new_tokens=32",
            "controller.eval_prompts=3",
            "controller.eval_temperature=0.5",
            "controller.eval_every=1",
            "controller.eval_sets=[{name: greedy, size: 2, temperature: 0, max_new_tokens: 9}]",
        ],
    )


def test_the_before_and_after_evaluation_samples_with_the_rollouts_stops_top_p_and_top_k() -> None:
    config = run_config()
    proxy = Recording()
    metrics = asyncio.run(evaluate_run(config, proxy, FakeTokenizer(), make_task(config.task), Rewards()))
    assert metrics["eval/num_prompts"] == 3 and len(proxy.sampling) == 3
    for sampling in proxy.sampling:
        assert sampling.stop_strings == ("</answer>", "####")
        assert (sampling.top_p, sampling.top_k) == (0.9, 7)
        assert (sampling.temperature, sampling.max_new_tokens) == (0.5, 32)  # evaluation's own


def test_an_eval_set_samples_with_the_rollouts_stops_top_p_and_top_k_at_its_own_temperature() -> None:
    config = run_config()
    proxy = Recording()
    task = make_task(config.task)
    metrics = asyncio.run(evaluate_sets(config, proxy, FakeTokenizer(), task, Rewards(), step=0))
    assert metrics["eval/greedy/num_prompts"] == 2 and len(proxy.sampling) == 2
    for sampling in proxy.sampling:
        assert sampling.stop_strings == ("</answer>", "####")
        assert (sampling.top_p, sampling.top_k) == (0.9, 7)
        assert (sampling.temperature, sampling.max_new_tokens) == (0.0, 9)  # the set's own
