"""The agentic producer against the real engine serving the shipped tiny-count model and its tokenizer,
playing the built-in count_chain env: the seams fit, and the trajectory is the conversation, exactly."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentic_helpers import tiny_model_group  # noqa: E402

from asyncrl.config.env import EnvConfig, EnvManagerConfig  # noqa: E402
from asyncrl.envs.count_chain import count_prompt, is_correct, plan_turns  # noqa: E402

ENV = EnvConfig(num_turns=2, max_start=30, min_span=2, max_span=3)


def test_tiny_model_plays_count_chain_through_the_real_engine() -> None:
    manager = EnvManagerConfig(num_env_groups=1, group_size=3, max_context_tokens=256)
    group, tokenizer = tiny_model_group(ENV, manager)
    assert len(group) == 3
    for t in group.trajectories:
        (a, b), (c, d) = plan_turns(ENV, t.info["env_seed"])
        responses = response_texts(tokenizer, t)
        assert t.info["turns"] == 2 and len(responses) == 2
        expected_text = count_prompt(a, b) + responses[0] + " " + count_prompt(c, d) + responses[1]
        assert tokenizer.decode(t.token_ids, skip_special_tokens=True) == expected_text
        assert t.reward == (is_correct(responses[0], a, b) + is_correct(responses[1], c, d)) / 2
        assert all(v == 0 for v, m in zip(t.versions, t.loss_mask, strict=True) if m)


def response_texts(tokenizer, t) -> list[str]:
    """The decoded runs of model tokens (loss mask 1), in order."""
    runs, current = [], []
    for token, mask in zip(t.token_ids, t.loss_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs.append(current)
    return [tokenizer.decode(run, skip_special_tokens=True) for run in runs if run]
