"""Agentic episodes rendered with the tokenizer's chat template (``env_manager.chat_format: template``): the
responses stay the tokens sampled, everything else is exactly what the template puts around them, also when it
rewrites earlier turns; and a real episode on the tiny model stops at the template's end-of-turn token."""

from __future__ import annotations

import os
from itertools import groupby

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentic_helpers import tiny_model_group  # noqa: E402

from asyncrl.config.env import EnvConfig, EnvManagerConfig  # noqa: E402
from asyncrl.envs.count_chain import count_prompt, plan_turns  # noqa: E402
from asyncrl.rollout.turns import TemplateTurns  # noqa: E402
from asyncrl.testing.chat_templates import QWEN3_LIKE, with_template  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]


def test_template_turns_keep_responses_as_sampled_and_add_what_the_template_adds() -> None:
    tokenizer = with_template(QWEN3_LIKE)
    turns = TemplateTurns(tokenizer)
    prompt = turns.first("Room 1.", TOOLS)
    assert tokenizer.decode(prompt).startswith(
        "<|im_start|>system\n# Tools"
    ) and "Room 1." in tokenizer.decode(prompt)
    response = "<think>\nleft\n</think>\n\nmove left"
    response_ids = tokenizer.encode(response, add_special_tokens=False)
    [im_end] = turns.stop_token_ids
    after = turns.after(response_ids + [im_end], response, True, "Room 2.")
    assert tokenizer.decode(after) == "\n<|im_start|>user\nRoom 2.<|im_end|>\n<|im_start|>assistant\n"
    context = prompt + response_ids + [im_end] + after
    whole = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "Room 1."},
            {"role": "assistant", "content": response},
            {"role": "user", "content": "Room 2."},
        ],
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "left\n</think>" not in whole  # the template itself would drop turn 1's reasoning now ...
    assert (
        tokenizer.decode(context).count("<think>\nleft\n</think>") == 1
    )  # ... the episode keeps what was sampled
    assert tokenizer.decode(context).replace("<think>\nleft\n</think>\n\n", "") == whole


def test_an_episode_on_the_tiny_model_is_the_template_conversation_exactly() -> None:
    env = EnvConfig(num_turns=2, max_start=30, min_span=2, max_span=3)
    manager = EnvManagerConfig(num_env_groups=1, group_size=2, max_context_tokens=512, chat_format="template")
    group, tokenizer = tiny_model_group(env, manager, max_kv_tokens=2048)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for t in group.trajectories:
        (a, b), (c, d) = plan_turns(env, t.info["env_seed"])
        model_runs, context_runs = runs(t.token_ids, t.loss_mask)
        assert len(model_runs) == 2
        assert (
            tokenizer.decode(context_runs[0])
            == f"<|im_start|>user\n{count_prompt(a, b)}<|im_end|>\n<|im_start|>assistant\n"
        )
        close = (
            "\n" if model_runs[0][-1] == im_end else "<|im_end|>\n"
        )  # the end-of-turn token, sampled or added
        # the env's later observations start with a space (count_chain's plain format)
        expected = f"{close}<|im_start|>user\n {count_prompt(c, d)}<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.decode(context_runs[1]) == expected
        assert all(im_end not in run[:-1] for run in model_runs)  # a response stops at the end-of-turn token


def runs(token_ids, loss_mask) -> tuple[list[list[int]], list[list[int]]]:
    """The runs of model tokens (mask 1) and of context tokens (mask 0), in order."""
    pieces = [
        (mask, [token for token, _ in group])
        for mask, group in groupby(zip(token_ids, loss_mask, strict=True), key=lambda x: x[1])
    ]
    return [run for mask, run in pieces if mask], [run for mask, run in pieces if not mask]
