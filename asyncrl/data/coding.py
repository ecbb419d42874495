"""The built-in ``code`` task: write a Python function ``f`` from input/output examples.

Each prompt shows ``num_items`` examples of a hidden rule drawn from a few families (affine maps, string
repetition, letter counts, list sums); the sample's tests (``metadata["tests"]``) check those examples and
three unseen inputs, so a program that only memorises the shown cases does not get full reward. The
reference solution is the demonstration (a fenced python block), and the sample's reward is ``code``.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

from asyncrl.data.procedural import Example

NUM_UNSEEN_TESTS = 3
_Rule = tuple[str, Callable[[Any], Any], Callable[[random.Random], Any]]
"""(body of ``f``'s return statement, the rule itself, a draw of one input)."""


def _affine(rng: random.Random) -> _Rule:
    a, b = rng.randint(-5, 5), rng.randint(-9, 9)
    body = f"{a} * x {'-' if b < 0 else '+'} {abs(b)}"
    return body, lambda x: a * x + b, lambda r: r.randint(-20, 20)


def _repeat(rng: random.Random) -> _Rule:
    k = rng.randint(2, 4)
    return f"x * {k}", lambda x: x * k, lambda r: "".join(r.choices("abc", k=r.randint(1, 3)))


def _count_letter(rng: random.Random) -> _Rule:
    letter = rng.choice("abc")
    return (
        f"x.count({letter!r})",
        lambda x: x.count(letter),
        lambda r: "".join(r.choices("abc", k=r.randint(0, 6))),
    )


def _list_sum(rng: random.Random) -> _Rule:
    k = rng.randint(0, 9)
    return f"sum(x) + {k}", lambda x: sum(x) + k, lambda r: [r.randint(0, 9) for _ in range(r.randint(0, 4))]


def _upper_first(rng: random.Random) -> _Rule:
    del rng
    return "x[:1].upper() + x[1:]", lambda x: x[:1].upper() + x[1:], _word


def _word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 5)))


RULES: tuple[Callable[[random.Random], _Rule], ...] = (
    _affine,
    _repeat,
    _count_letter,
    _list_sum,
    _upper_first,
)


def code_example(rng: random.Random, num_items: int) -> Example:
    """A prompt with ``num_items`` examples ``f(input) == output``; tests cover them and unseen inputs."""
    body, rule, draw = rng.choice(RULES)(rng)
    inputs = [draw(rng) for _ in range(num_items + NUM_UNSEEN_TESTS)]
    cases = [f"f({x!r}) == {rule(x)!r}" for x in inputs]
    shown = "\n".join(cases[:num_items])
    solution = f"def f(x):\n    return {body}\n"
    return Example(
        prompt=f"Write a Python function f such that:\n{shown}\nAnswer with a ```python block.\n",
        demonstration=f"```python\n{solution}```",
        answer=solution,
        answer_delimiter=None,
        format_regex=r"(?s).*```python\n.*```\s*",
        reward="code",
        metadata={"tests": [f"assert {case}" for case in cases]},
    )
