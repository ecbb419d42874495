"""Held-out evaluation through the same proxy and engines that serve rollouts.

Key decision: one seeded sample per prompt at the configured temperature (1 by default), so the number is the
policy's expected reward — the quantity RL optimises — and before/after numbers of one run are comparable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from asyncrl.rewards.service import RewardService
from asyncrl.rollout.rlvr_producer import GenerateClient, request_seed
from asyncrl.tasks.base import TaskSample, render_prompt
from asyncrl.types import Request, SamplingParams


async def evaluate(
    proxy: GenerateClient,
    tokenizer: Any,
    samples: Sequence[TaskSample],
    rewards: RewardService,
    *,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    tag: str = "eval",
) -> dict[str, float]:
    """Mean reward, failure count and mean response length of one sample per held-out prompt."""

    async def one(sample: TaskSample) -> tuple[float, bool, int]:
        request = Request(
            request_id=f"{tag}:{sample.uid}",
            prompt_token_ids=tokenizer.encode(render_prompt(sample, tokenizer)),
            sampling=SamplingParams(
                max_new_tokens=max_new_tokens, temperature=temperature, seed=request_seed(seed, sample.uid, 0)
            ),
        )
        generation = await proxy.generate(request)
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        result = await rewards.score(text, sample)
        return result.reward, result.ok, generation.num_tokens

    results = await asyncio.gather(*(one(s) for s in samples))
    return {
        "eval/reward_mean": sum(r for r, _, _ in results) / len(results),
        "eval/failed": float(sum(not ok for _, ok, _ in results)),
        "eval/response_length_mean": sum(n for _, _, n in results) / len(results),
        "eval/num_prompts": float(len(results)),
    }
