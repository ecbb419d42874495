"""``evaluate_env``: held-out env episodes through a scripted proxy, with exact expected returns."""

from __future__ import annotations

import asyncio
import re

from asyncrl.config.controller import ControllerConfig, EvalSetConfig
from asyncrl.config.env import EnvConfig, EnvManagerConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.run import RunConfig
from asyncrl.controller.evaluation import evaluate_env
from asyncrl.controller.periodic_eval import evaluate_sets
from asyncrl.envs import make_env
from asyncrl.envs.count_chain import expected_answer, plan_turns
from asyncrl.rollout.env_manager import env_seed
from asyncrl.types import FinishReason, Generation, Request

ENV = EnvConfig(num_turns=3, max_start=20, min_span=2, max_span=3)
SEED = 5


class CharTokenizer:
    """One token per character."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class EvenOracle:
    """Answers the context's last ``count A to B:`` correctly when A is even, with "0" otherwise."""

    def __init__(self) -> None:
        self.requests: list[Request] = []

    async def generate(self, request: Request) -> Generation:
        self.requests.append(request)
        context = CharTokenizer().decode(request.prompt_token_ids)
        start, end = map(int, re.findall(r"count (\d+) to (\d+):", context)[-1])
        text = " " + (expected_answer(start, end) if start % 2 == 0 else "0")
        ids = CharTokenizer().encode(text)
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            versions=[0] * len(ids),
            finish_reason=FinishReason.STOP,
        )

    async def abort(self, request_id: str) -> None:
        raise AssertionError("evaluation never aborts")


def run_eval(oracle: EvenOracle, num_episodes: int) -> dict[str, float]:
    return asyncio.run(
        evaluate_env(
            oracle,
            CharTokenizer(),
            make_env=lambda: make_env(ENV),
            rollout=RolloutConfig(max_new_tokens=32),
            manager=EnvManagerConfig(max_context_tokens=4096),
            num_episodes=num_episodes,
            temperature=0.5,
            max_new_tokens=32,
            seed=SEED,
        )
    )


def test_mean_return_turns_and_tokens_are_exact():
    oracle = EvenOracle()
    metrics = run_eval(oracle, num_episodes=6)
    plans = [plan_turns(ENV, env_seed(SEED, f"eval{i}")) for i in range(6)]
    returns = [sum(a % 2 == 0 for a, _ in plan) / 3 for plan in plans]
    tokens = [sum(len(" " + expected_answer(a, b)) if a % 2 == 0 else 2 for a, b in plan) for plan in plans]
    assert metrics == {
        "eval/reward_mean": sum(returns) / 6,
        "eval/failed": 0.0,
        "eval/response_length_mean": sum(tokens) / 6,
        "eval/turns_mean": 3.0,
        "eval/num_prompts": 6.0,
    }
    assert 0 < metrics["eval/reward_mean"] < 1  # the seeds mix right and wrong turns
    assert {r.sampling.temperature for r in oracle.requests} == {0.5}


def test_before_and_after_play_the_same_episodes_with_the_same_sampling_seeds():
    first, second = EvenOracle(), EvenOracle()
    run_eval(first, num_episodes=4)
    run_eval(second, num_episodes=4)

    def by_id(oracle: EvenOracle) -> dict[str, tuple[list[int], int | None]]:
        return {r.request_id: (r.prompt_token_ids, r.sampling.seed) for r in oracle.requests}

    assert by_id(first) == by_id(second)
    assert len(first.requests) == 4 * 3


def test_an_agentic_eval_set_samples_every_turn_at_its_own_length_and_temperature():
    """``controller.eval_sets[].max_new_tokens`` is the answer length of an agentic set's every turn, as of a
    prompt set's answer (``eval_sampling``); a set that leaves it null gets ``rollout.max_new_tokens``."""
    config = RunConfig(
        producer="agentic",
        env=ENV,
        env_manager=EnvManagerConfig(max_context_tokens=4096),
        rollout=RolloutConfig(max_new_tokens=32),
        controller=ControllerConfig(
            num_steps=2,
            eval_every=1,
            eval_sets=[
                EvalSetConfig(name="short", size=2, temperature=0.25, max_new_tokens=7),
                EvalSetConfig(name="default", size=2),
            ],
        ),
    )
    oracle = EvenOracle()
    metrics = asyncio.run(evaluate_sets(config, oracle, CharTokenizer(), None, None, step=0))
    assert metrics["eval/short/turns_mean"] == metrics["eval/default/turns_mean"] == 3.0

    def sampling_of(name: str) -> set[tuple[int, float]]:
        return {
            (r.sampling.max_new_tokens, r.sampling.temperature)
            for r in oracle.requests
            if r.request_id.startswith(f"eval@0/{name}/")
        }

    assert sampling_of("short") == {(7, 0.25)}
    assert sampling_of("default") == {(32, 1.0)}
