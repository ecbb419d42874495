"""Built-in procedural tasks whose response length is set by the prompt and drawn from a long tail.

Each generator maps (rng, number of items) to one example; ``ProceduralTask`` turns a generator into two
disjoint, seeded splits. Disjointness is by construction: a stable hash of the prompt text assigns every
possible prompt to exactly one split, and each split's stream skips prompts that belong to the other. A
split may repeat a prompt (short prompts have few variants); removing repeats would skew the length
distribution toward the long tail.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.data.base import Split, TaskSample, check_split, held_out
from asyncrl.data.lengths import long_tail_count

MAX_COUNT_NUMBER = 999
"""Counting stays within 0..999, so every number is at most three digit tokens."""


@dataclass(frozen=True, kw_only=True)
class Example:
    """What a generator produces: the prompt, a correct response, and how to verify one."""

    prompt: str
    demonstration: str
    answer: str
    answer_delimiter: str | None
    format_regex: str
    reward: str = "exact_match"
    metadata: Mapping[str, Any] = field(default_factory=dict)


Generator = Callable[[random.Random, int], Example]


def count_example(rng: random.Random, num_items: int) -> Example:
    """``count 17 to 20:`` → `` 17 18 19 20``: the whole list is the answer."""
    start = rng.randint(0, MAX_COUNT_NUMBER - num_items + 1)
    numbers = " ".join(str(n) for n in range(start, start + num_items))
    return Example(
        prompt=f"count {start} to {start + num_items - 1}:",
        demonstration=f" {numbers}",
        answer=numbers,
        answer_delimiter=None,
        format_regex=r"\s*\d+( \d+)*\s*",
    )


def copy_example(rng: random.Random, num_items: int) -> Example:
    """``copy k q b:`` → `` k q b``."""
    letters = " ".join(rng.choices(string.ascii_lowercase, k=num_items))
    return _letters_example("copy", letters, letters)


def reverse_example(rng: random.Random, num_items: int) -> Example:
    """``reverse k q b:`` → `` b q k``."""
    letters = rng.choices(string.ascii_lowercase, k=num_items)
    return _letters_example("reverse", " ".join(letters), " ".join(reversed(letters)))


def running_sum_example(rng: random.Random, num_items: int) -> Example:
    """``sum 3 1 4:`` → `` 3 4 8 = 8``: the prefix sums, then the total after ``=``."""
    digits = [rng.randint(1, 9) for _ in range(num_items)]
    sums = [sum(digits[: i + 1]) for i in range(num_items)]
    return Example(
        prompt=f"sum {' '.join(map(str, digits))}:",
        demonstration=f" {' '.join(map(str, sums))} = {sums[-1]}",
        answer=str(sums[-1]),
        answer_delimiter="=",
        format_regex=r"\s*\d+( \d+)* = \d+\s*",
    )


def _letters_example(verb: str, shown: str, expected: str) -> Example:
    return Example(
        prompt=f"{verb} {shown}:",
        demonstration=f" {expected}",
        answer=expected,
        answer_delimiter=None,
        format_regex=r"\s*[a-z]( [a-z])*\s*",
    )


GENERATORS: dict[str, Generator] = {
    "count": count_example,
    "copy": copy_example,
    "reverse": reverse_example,
    "running_sum": running_sum_example,
}


@dataclass(frozen=True, kw_only=True)
class LengthSpec:
    """The long-tail distribution of the number of items per prompt."""

    median: float
    sigma: float
    max_items: int


class ProceduralTask:
    """A built-in task: seeded, disjoint train/eval splits drawn from a generator, built once and cached."""

    def __init__(
        self,
        name: str,
        *,
        seed: int,
        sizes: dict[Split, int],
        lengths: LengthSpec,
        eval_fraction: float,
        generator: Generator | None = None,
    ) -> None:
        if generator is None and name not in GENERATORS:
            raise ValueError(f"task.type must be one of {', '.join(map(repr, GENERATORS))}, got {name!r}")
        self.name = name
        self._generator = generator or GENERATORS[name]
        self._seed = seed
        self._sizes = sizes
        self._lengths = lengths
        self._eval_fraction = eval_fraction
        self._cache: dict[Split, list[TaskSample]] = {}

    def split(self, split: Split) -> list[TaskSample]:
        """The samples of ``split``, generated on first use (deterministic in the seed)."""
        split = check_split(split)
        if split not in self._cache:
            self._cache[split] = self._generate(split)
        return self._cache[split]

    def split_of(self, prompt: str) -> Split:
        """The split a prompt belongs to, from a stable hash of the seed and the prompt text."""
        return "eval" if held_out(prompt, seed=self._seed, fraction=self._eval_fraction) else "train"

    def _generate(self, split: Split) -> list[TaskSample]:
        rng = random.Random(f"{self.name}:{self._seed}:{split}")
        wanted, max_draws = self._sizes[split], 100 * self._sizes[split] + 1000
        samples: list[TaskSample] = []
        for _ in range(max_draws):
            num_items, example = self._draw(rng)
            if self.split_of(example.prompt) != split:
                continue
            samples.append(self._to_sample(example, num_items, f"{self.name}-{split}-{len(samples):06d}"))
            if len(samples) == wanted:
                return samples
        raise ValueError(
            f"the {self.name!r} task found only {len(samples)} of task.num_{split} = {wanted} {split} prompts "
            f"in {max_draws} draws; raise task.eval_fraction"
        )

    def _draw(self, rng: random.Random) -> tuple[int, Example]:
        spec = self._lengths
        num_items = long_tail_count(rng, median=spec.median, sigma=spec.sigma, max_items=spec.max_items)
        return num_items, self._generator(rng, num_items)

    @staticmethod
    def _to_sample(example: Example, num_items: int, uid: str) -> TaskSample:
        return TaskSample(
            uid=uid,
            prompt=example.prompt,
            answer=example.answer,
            demonstration=example.demonstration,
            answer_delimiter=example.answer_delimiter,
            format_regex=example.format_regex,
            reward=example.reward,
            metadata={**example.metadata, "num_items": num_items},
        )
