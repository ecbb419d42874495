"""A small seeded corpus for training a default tokenizer when no task texts are given.

It mixes the shapes the built-in tasks and chat prompts use (numbers, letter lists, arithmetic, short
sentences, punctuation, newlines), so common pieces such as `` to``, `` =`` and ``:\\n`` become single tokens.
"""

from __future__ import annotations

import random
import string

_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "be",
    "by",
    "this",
    "are",
    "or",
    "from",
    "at",
    "not",
    "but",
    "have",
    "what",
    "all",
    "count",
    "copy",
    "reverse",
    "sum",
    "answer",
    "question",
    "number",
    "numbers",
    "letter",
    "letters",
    "list",
    "total",
    "result",
    "first",
    "last",
    "step",
    "think",
    "so",
    "then",
    "next",
    "each",
    "add",
    "plus",
    "minus",
    "times",
    "equals",
    "is",
    "correct",
    "wrong",
    "final",
    "user",
    "assistant",
]


def sample_texts(num_texts: int = 2000, seed: int = 0) -> list[str]:
    """``num_texts`` short texts, the same for the same seed."""
    rng = random.Random(seed)
    makers = (_sentence, _numbers, _letters, _arithmetic, _chat_like)
    return [rng.choice(makers)(rng) for _ in range(num_texts)]


def _sentence(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(3, 12))
    return " ".join(words).capitalize() + rng.choice(".?!:;,")


def _numbers(rng: random.Random) -> str:
    start = rng.randint(0, 999)
    stop = start + rng.randint(1, 12)
    return f"count {start} to {stop}: " + " ".join(str(n) for n in range(start, stop + 1))


def _letters(rng: random.Random) -> str:
    letters = rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))
    return f"{rng.choice(('copy', 'reverse'))} {' '.join(letters)}:\n {' '.join(reversed(letters))}"


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 9999), rng.randint(0, 9999)
    op, value = rng.choice((("+", a + b), ("-", a - b), ("*", a * b)))
    return f"What is {a} {op} {b}?\nThe answer is {value}. #### {value}"


def _chat_like(rng: random.Random) -> str:
    question = _sentence(rng)
    return f"user\n{question}\nassistant\n{_sentence(rng)} ({rng.randint(1, 100)}%)\n\n"
