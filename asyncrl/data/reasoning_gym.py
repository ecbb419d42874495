"""Adapter for ``reasoning-gym`` procedural datasets (offline): their entries become ``TaskSample``s.

Key decision: the dataset's own ``score_answer`` is the reward (registered as ``reasoning_gym``); the entry
it needs travels in the sample's metadata, so scoring stays a pure function of (response, sample).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncrl.data.base import Split, TaskSample, check_split

EVAL_SEED_OFFSET = 1_000_003
"""The eval split is generated with seed + this offset; questions also in the train split are dropped."""


class ReasoningGymTask:
    """Train and eval splits of one reasoning-gym dataset, disjoint by question text."""

    def __init__(
        self, dataset_name: str, *, seed: int, sizes: dict[Split, int], dataset_kwargs: Mapping[str, Any]
    ) -> None:
        self.name = f"reasoning_gym:{dataset_name}"
        self._dataset_name = dataset_name
        self._seed = seed
        self._sizes = sizes
        self._kwargs = dict(dataset_kwargs)
        self._cache: dict[Split, list[TaskSample]] = {}

    def split(self, split: Split) -> list[TaskSample]:
        """The samples of ``split``, generated on first use."""
        split = check_split(split)
        if not self._cache:
            self._cache = self._generate()
        return self._cache[split]

    def _generate(self) -> dict[Split, list[TaskSample]]:
        train = self._entries(self._seed, self._sizes["train"])
        train_questions = {entry["question"] for entry in train}
        eval_entries = self._entries(self._seed + EVAL_SEED_OFFSET, self._sizes["eval"])
        eval_entries = [e for e in eval_entries if e["question"] not in train_questions]
        if not eval_entries:
            raise ValueError(f"reasoning_gym dataset {self._dataset_name!r}: every eval question is in train")
        return {
            "train": [entry_to_sample(e, f"{self.name}-train-{i:06d}") for i, e in enumerate(train)],
            "eval": [entry_to_sample(e, f"{self.name}-eval-{i:06d}") for i, e in enumerate(eval_entries)],
        }

    def _entries(self, seed: int, size: int) -> list[dict[str, Any]]:
        import reasoning_gym  # heavy import, only when this task is used

        try:
            dataset = reasoning_gym.create_dataset(self._dataset_name, seed=seed, size=size, **self._kwargs)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"task.dataset_name / task.dataset_kwargs: reasoning_gym refused: {err}"
            ) from err
        return [dataset[i] for i in range(size)]


def entry_to_sample(entry: Mapping[str, Any], uid: str) -> TaskSample:
    """A reasoning-gym entry ({question, answer, metadata}) as a sample scored by its dataset's scorer."""
    return TaskSample(
        uid=uid,
        prompt=entry["question"],
        answer=str(entry["answer"]),
        messages=({"role": "user", "content": entry["question"]},),
        demonstration=f" {entry['answer']}" if entry["answer"] is not None else None,
        reward="reasoning_gym",
        metadata={"entry": dict(entry)},
    )
