"""A chat-templated prompt's response ends at the template's end-of-turn token, in RLVR rollouts, in evaluation
and in the SFT warm start's sampling, even when the model's EOS (its generation config) is another token: the case of Qwen3 Base, whose
generation config lists only ``<|endoftext|>`` while its template closes turns with ``<|im_end|>``.

The model and tokenizer are the project's own tiny ones (``build_tiny``: EOS ``<|endoftext|>``, a ChatML
template), with the output row of ``<|im_end|>`` made to win a few tokens into the answer, so the model closes its
turn there and, without the stop, would write on to ``max_new_tokens``."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch

from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.engine import EngineConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.reward import RewardConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.controller.evaluation import score_answers
from asyncrl.data.base import TaskSample, prompt_token_ids
from asyncrl.engine import make_engine
from asyncrl.models.sft import evaluate_by_sampling
from asyncrl.models.tiny import build_tiny
from asyncrl.proxy import LLMProxy
from asyncrl.rewards.service import RewardService
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.serve.chat_format import PromptStops
from asyncrl.types import Group, TrajectoryStatus

MAX_NEW_TOKENS = 24
CHAT = TaskSample(
    uid="chat", prompt="1 + 2 =", answer="3", messages=({"role": "user", "content": "1 + 2 ="},)
)
PLAIN = TaskSample(uid="plain", prompt="1 + 2 =", answer="3")


@torch.inference_mode()
def _greedy(model: Any, prompt: list[int]) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def closing_model() -> tuple[Any, Any, list[int]]:
    """(model, tokenizer, the model's greedy answer to ``CHAT`` up to and with its first ``<|im_end|>``)."""
    texts = ["what is 1 + 2 ? the answer is 3", "2 + 2 = 4 and 3 + 4 = 7", "user assistant answer"] * 20
    model, tokenizer = build_tiny(texts, vocab_size=300, architecture="qwen3", tie_word_embeddings=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id != im_end  # the Base-model case
    prompt = prompt_token_ids(CHAT, tokenizer)
    greedy = _greedy(model, prompt)
    # The first answer token not seen before it gets an <|im_end|> twin that outscores it by 1 %: the model
    # answers as before up to there and then closes its turn.
    closing = next(token for i, token in enumerate(greedy) if i > 0 and token not in greedy[:i])
    with torch.no_grad():
        model.lm_head.weight[im_end] = 1.01 * model.lm_head.weight[closing]
    answer = _greedy(model, prompt)
    assert 0 < answer.index(im_end) < MAX_NEW_TOKENS - 1, answer  # a few tokens in, with tokens to spare
    return model, tokenizer, answer[: answer.index(im_end) + 1]


def _serve(model: Any, tokenizer: Any, run: Any) -> Any:
    """``run(proxy)`` against the built-in engine serving ``model`` (greedy)."""
    engine = make_engine(model, tokenizer, EngineConfig(max_running_requests=2, max_kv_tokens=256))

    async def main() -> Any:
        proxy = LLMProxy([engine], ProxyConfig(update_policy="drain"))
        try:
            return await run(proxy)
        finally:
            proxy.close()

    try:
        return asyncio.run(main())
    finally:
        engine.shutdown()


def test_the_stop_is_the_templates_end_of_turn_for_templated_prompts_only(closing_model) -> None:
    _, tokenizer, _ = closing_model
    stops = PromptStops(tokenizer)
    assert stops(CHAT) == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert stops(PLAIN) == ()


def test_an_rlvr_rollout_of_a_templated_prompt_stops_at_the_end_of_turn(closing_model) -> None:
    model, tokenizer, answer = closing_model
    rewards = RewardService.from_config(RewardConfig())

    async def first_group(proxy: LLMProxy) -> Group:
        buffer = SampleBuffer(BufferConfig(async_ratio=0.0), groups_per_batch=1, group_size=1)
        producer = RLVRProducer(
            source=PromptSource([CHAT], seed=0),
            proxy=proxy,
            rewards=rewards,
            buffer=buffer,
            tokenizer=tokenizer,
            config=RolloutConfig(
                rollout_batch_size=1, num_return_sequences=1, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0
            ),
            seed=0,
        )
        task = asyncio.ensure_future(producer.run())
        (group,) = await buffer.get_batch(0)
        buffer.close()
        await task
        return group

    try:
        group = _serve(model, tokenizer, first_group)
    finally:
        rewards.close()
    (trajectory,) = group.trajectories
    assert list(trajectory.token_ids)[trajectory.num_prompt_tokens :] == answer
    assert trajectory.status is TrajectoryStatus.COMPLETED  # not truncated at max_new_tokens


def test_an_evaluation_answer_to_a_templated_prompt_stops_at_the_end_of_turn(closing_model) -> None:
    model, tokenizer, answer = closing_model
    rewards = RewardService.from_config(RewardConfig())

    async def evaluate(proxy: LLMProxy) -> list:
        return await score_answers(
            proxy,
            tokenizer,
            [CHAT],
            rewards,
            rollout=RolloutConfig(),
            temperature=0.0,
            max_new_tokens=MAX_NEW_TOKENS,
            seed=0,
        )

    try:
        (scored,) = _serve(model, tokenizer, evaluate)
    finally:
        rewards.close()
    assert scored.num_tokens == len(answer)


def test_sft_sampling_of_a_templated_prompt_stops_at_the_end_of_turn(closing_model) -> None:
    """The warm start samples at temperature 1; logits scaled a million-fold make that sampling the greedy
    answer, which closes its turn a few tokens in."""
    model, tokenizer, _ = closing_model
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(1e6)
    greedy = _greedy(sharp, prompt_token_ids(CHAT, tokenizer))
    answer = greedy[: greedy.index(tokenizer.convert_tokens_to_ids("<|im_end|>")) + 1]
    result = evaluate_by_sampling(sharp, tokenizer, [CHAT], k=2, max_new_tokens=MAX_NEW_TOKENS, seed=0)
    assert result.mean_response_tokens == len(answer)
