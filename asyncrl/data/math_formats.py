"""Prompt templates of the two math answer conventions: GSM8K's ``#### answer`` and MATH's ``\\boxed{answer}``.

Key decision: a template does three things to a dataset row, all at load time: it appends the instruction that
asks for the convention, cuts the reference answer out of the dataset's worked solution the same way (GSM8K's
``answer`` column is a solution ending in ``#### 72``; MATH's ``solution`` holds a ``\\boxed{}``), and sets the
verifier to ``math_equiv``, so the reward compares the model's final answer with the reference by value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GSM8K_MARKER = "####"


@dataclass(frozen=True)
class MathFormat:
    """One answer convention: what the prompt asks for and how answers are cut out of text."""

    instruction: str
    """Appended to the prompt (the last user message of a chat row) after a blank line."""
    answer_delimiter: str | None
    """The response's final answer follows the last occurrence of this marker; None: math-verify reads the
    whole response (it prefers the last ``\\boxed{}``)."""
    reference: Callable[[str], str]
    """The reference final answer of a dataset answer field (a worked solution or a bare answer)."""


def gsm8k_reference(answer: str) -> str:
    """The number after GSM8K's last ``####`` (thousands separators dropped); a bare answer as it is."""
    _, marker, tail = answer.rpartition(GSM8K_MARKER)
    return (tail if marker else answer).strip().replace(",", "")


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if
    there is none or it is never closed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    opening = text.index("{", start)
    depth = 0
    for index in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[opening + 1 : index]
    return None


def boxed_reference(answer: str) -> str:
    """The last ``\\boxed{}`` of a MATH solution; a bare answer (MATH-500's ``answer`` column) as it is."""
    boxed = last_boxed(answer)
    return (boxed if boxed is not None else answer).strip()


MATH_FORMATS: dict[str, MathFormat] = {
    "gsm8k": MathFormat(
        instruction=f'Let\'s think step by step and output the final answer after "{GSM8K_MARKER}".',
        answer_delimiter=GSM8K_MARKER,
        reference=gsm8k_reference,
    ),
    "boxed": MathFormat(
        instruction="Please reason step by step, and put your final answer within \\boxed{}.",
        answer_delimiter=None,
        reference=boxed_reference,
    ),
}
"""``task.prompt_format`` name → its convention."""


def math_format(name: str) -> MathFormat:
    if name not in MATH_FORMATS:
        raise ValueError(
            f"task.prompt_format must be one of {', '.join(map(repr, MATH_FORMATS))}, got {name!r}"
        )
    return MATH_FORMATS[name]
