"""A task over user rows: a train source and either an eval source or a hash-held-out share of the train rows.

Key decision: a source is anything that yields ``(row number, row)`` — a JSONL/Parquet file (``read_rows``) or a
split of a Hugging Face dataset on disk (``hf_dataset.read_dataset_rows``) — so both kinds share the row
validation, the uids and the held-out split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asyncrl.data.base import Split, TaskSample, check_split, held_out
from asyncrl.data.loader import FieldSpec, samples_from_rows


@dataclass(frozen=True)
class RowSource:
    """Where rows come from (``name`` is what errors cite) and how to read them."""

    name: str
    read: Callable[[], Iterable[tuple[int, Any]]]


class FileTask:
    """Train/eval splits read from row sources, loaded once on first use."""

    def __init__(
        self,
        train: RowSource,
        eval_source: RowSource | None,
        fields: FieldSpec,
        *,
        seed: int,
        eval_fraction: float,
        name: str = "file",
    ) -> None:
        self.name = name
        self._train = train
        self._eval = eval_source
        self._fields = fields
        self._seed = seed
        self._eval_fraction = eval_fraction
        self._cache: dict[Split, list[TaskSample]] = {}

    def split(self, split: Split) -> list[TaskSample]:
        """The samples of ``split``; without an eval source, rows are split by a stable hash of their prompt."""
        split = check_split(split)
        if not self._cache:
            self._cache = self._load()
        return self._cache[split]

    def _samples(self, source: RowSource, uid_prefix: str) -> list[TaskSample]:
        return samples_from_rows(source.read(), self._fields, uid_prefix, where=source.name)

    def _load(self) -> dict[Split, list[TaskSample]]:
        train = self._samples(self._train, "train")
        if self._eval is not None:
            return {"train": train, "eval": self._samples(self._eval, "eval")}
        is_eval = [held_out(s.prompt, seed=self._seed, fraction=self._eval_fraction) for s in train]
        splits: dict[Split, list[TaskSample]] = {
            "train": [s for s, e in zip(train, is_eval, strict=True) if not e],
            "eval": [s for s, e in zip(train, is_eval, strict=True) if e],
        }
        if not splits["train"] or not splits["eval"]:
            raise ValueError(
                f"{self._train.name}: holding out task.eval_fraction={self._eval_fraction} of "
                f"{len(train)} rows left an empty split; set an eval source or change task.eval_fraction"
            )
        return splits
