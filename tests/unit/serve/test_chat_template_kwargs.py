"""``task.chat_template_kwargs`` reach every chat template of a run: training prompts, evaluation prompts (the
run's task and an eval set's own), and the OpenAI endpoint. The template here branches on ``enable_thinking``
the way Qwen3's does (thinking unless told otherwise), on the tiny tokenizer: nothing comes from the hub."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from serve_helpers import ScriptedEngine, client, serve_in_thread

from asyncrl.config.run import load_run_config
from asyncrl.config.serve import ServeConfig
from asyncrl.config.task import TaskConfig
from asyncrl.controller.evaluation import score_answers
from asyncrl.data.base import prompt_token_ids, render_prompt
from asyncrl.data.registry import make_task
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rewards.service import RewardService
from asyncrl.serve.service import CompletionService
from asyncrl.testing.chat_templates import with_template
from asyncrl.types import FinishReason, Generation, Request

THINKING = """\
{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- 'NOTHINK' }}{%- else %}{{- 'THINK' }}{%- endif %}
{%- endif %}"""
"""Qwen3's switch, reduced to a marker: the generation prompt says which way the template went."""

OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return with_template(THINKING)


def rendered(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids).rsplit("<|im_start|>assistant\n", 1)[1]


@pytest.mark.parametrize("chat_template", ["always", "messages"])
def test_training_prompts_render_with_the_kwargs_and_without_them_the_template_default(
    tokenizer, chat_template
):
    rows = {"chat_template": chat_template, "type": "copy"}
    plain = make_task(TaskConfig(**rows)).split("train")[0]
    told = make_task(TaskConfig(**rows, chat_template_kwargs=OFF)).split("train")[0]
    if chat_template == "messages":  # plain prompts: no template, so nothing to pass
        assert told.messages is None and prompt_token_ids(told, tokenizer) == tokenizer.encode(told.prompt)
        return
    assert rendered(tokenizer, prompt_token_ids(plain, tokenizer)) == "THINK"
    assert rendered(tokenizer, prompt_token_ids(told, tokenizer)) == "NOTHINK"
    assert render_prompt(told, tokenizer).endswith("NOTHINK")
    assert render_prompt(plain, tokenizer).endswith("\nTHINK")


class Recording:
    """A proxy that answers every request with EOS and keeps the prompts it was sent."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    async def generate(self, request: Request) -> Generation:
        self.prompts.append(list(request.prompt_token_ids))
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=[0],
            logprobs=[-0.1],
            versions=[0],
            finish_reason=FinishReason.STOP,
        )


def test_evaluation_prompts_render_with_the_kwargs_and_an_eval_sets_own_task_inherits_them(tokenizer):
    config = load_run_config(
        None,
        [
            "task.chat_template=always",
            "task.chat_template_kwargs.enable_thinking=false",
            "controller.eval_every=1",
            "controller.eval_sets=[{name: own, task: {type: reverse, chat_template: always}}, {name: run}]",
        ],
    )
    own, run = config.controller.eval_sets
    assert own.task is not None and own.task.chat_template_kwargs == OFF and run.task is None
    proxy = Recording()
    samples = make_task(own.task).split("eval")[:2] + make_task(config.task).split("eval")[:2]
    rewards = RewardService.from_config(config.reward)
    try:
        asyncio.run(
            score_answers(
                proxy,
                tokenizer,
                samples,
                rewards,
                rollout=config.rollout,
                temperature=1.0,
                max_new_tokens=4,
                seed=0,
            )
        )
    finally:
        rewards.close()
    assert len(proxy.prompts) == 4
    assert all(rendered(tokenizer, ids) == "NOTHINK" for ids in proxy.prompts)


def serve(tokenizer: Any, kwargs: dict | None):
    scripted = ScriptedEngine(tokenizer, ["a b"])
    proxy = LLMProxy([scripted])
    config = ServeConfig(port=0, chat_format="template", api_key="sekrit", max_tokens_limit=64)
    service = CompletionService(proxy=proxy, tokenizer=tokenizer, config=config, chat_template_kwargs=kwargs)
    return serve_in_thread(service, proxy, scripted)


@pytest.mark.parametrize(("kwargs", "expected"), [(OFF, "NOTHINK"), (None, "THINK")])
def test_the_endpoint_renders_with_the_kwargs(tokenizer, kwargs, expected):
    for served in serve(tokenizer, kwargs):
        c = client(served, "t1")
        c.chat.completions.create(model="asyncrl-policy", messages=[{"role": "user", "content": "copy a b:"}])
        tokens = served.service.store.get("t1").live_branch.token_ids
        text = tokenizer.decode(tokens)
        assert f"<|im_start|>assistant\n{expected}a b" in text
