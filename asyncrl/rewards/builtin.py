"""Built-in rewards: exact answer match, math equivalence (math-verify), format, reasoning-gym scoring, and
unit tests on model-written code (run only in the sandbox)."""

from __future__ import annotations

import re
from typing import Any

from asyncrl.config.reward import RewardConfig
from asyncrl.data.base import TaskSample, extract_answer, normalize_answer
from asyncrl.rewards.registry import RewardFn, register_reward, register_reward_factory


@register_reward("exact_match")
def exact_match(response_text: str, sample: TaskSample) -> float:
    """1.0 when the response's final answer equals the reference (whitespace-normalised), else 0.0."""
    return float(extract_answer(response_text, sample) == normalize_answer(sample.answer))


@register_reward("format")
def format_reward(response_text: str, sample: TaskSample) -> float:
    """1.0 when the response is well formed: it fully matches the sample's ``format_regex``; without one, it
    holds the answer delimiter (if any) followed by a non-empty answer, or is non-empty."""
    if sample.format_regex is not None:
        return float(re.fullmatch(sample.format_regex, response_text) is not None)
    return float(extract_answer(response_text, sample) != "")


@register_reward("math_equiv")
def math_equiv(response_text: str, sample: TaskSample) -> tuple[float, dict[str, Any]]:
    """1.0 when math-verify finds the response's final answer equivalent to the reference.

    math-verify's own timeouts use ``signal.alarm``, which only works on the main thread, so they are turned
    off here; the reward service enforces the timeout instead.
    """
    from math_verify import parse, verify  # heavy import (sympy), only when used

    candidate = (
        response_text.rpartition(sample.answer_delimiter)[2] if sample.answer_delimiter else response_text
    )
    gold = parse(latex_delimited(sample.answer), parsing_timeout=None)
    predicted = parse(candidate, parsing_timeout=None)
    correct = verify(gold, predicted, timeout_seconds=None)
    return float(correct), {"parsed": [str(p) for p in predicted]}


LATEX_OPENERS = ("$", "\\(", "\\[", "\\boxed")


def latex_delimited(answer: str) -> str:
    """A reference answer as math-verify's LaTeX reader expects it: inside ``$...$`` unless already delimited.

    Why: a bare ``3\\sqrt{2}`` (a MATH reference cut out of its ``\\boxed{}``) parses as 3, and ``x^2+1`` as
    nothing; inside ``$...$`` both parse whole. Plain numbers parse the same either way."""
    return answer if answer.lstrip().startswith(LATEX_OPENERS) else f"${answer}$"


@register_reward("reasoning_gym")
def reasoning_gym_score(response_text: str, sample: TaskSample) -> float:
    """The reasoning-gym dataset's own ``score_answer`` on the stripped response (entry from the metadata)."""
    import reasoning_gym

    entry = sample.metadata.get("entry")
    if not isinstance(entry, dict):
        raise ValueError(f"sample {sample.uid} has no reasoning-gym 'entry' in its metadata")
    score_answer = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    return float(score_answer(extract_answer(response_text, sample), entry))


@register_reward_factory("code")
def code_reward(config: RewardConfig) -> RewardFn:
    """Share of the sample's unit tests (``metadata["tests"]``) the response's program passes, run only in
    the sandbox ``config.code.sandbox`` (probed now: an unusable sandbox fails here, at start-up)."""
    from asyncrl.rewards.code import CodeReward

    return CodeReward(config.code)
