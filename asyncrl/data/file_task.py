"""A task over user dataset files: a train file and either an eval file or a hash-held-out share of it."""

from __future__ import annotations

from asyncrl.data.base import Split, TaskSample, check_split, held_out
from asyncrl.data.loader import FieldSpec, load_samples


class FileTask:
    """Train/eval splits read from JSONL or Parquet files, loaded once on first use."""

    def __init__(
        self, train_path: str, eval_path: str, fields: FieldSpec, *, seed: int, eval_fraction: float
    ) -> None:
        self.name = "file"
        self._train_path = train_path
        self._eval_path = eval_path
        self._fields = fields
        self._seed = seed
        self._eval_fraction = eval_fraction
        self._cache: dict[Split, list[TaskSample]] = {}

    def split(self, split: Split) -> list[TaskSample]:
        """The samples of ``split``; without an eval file, rows are split by a stable hash of their prompt."""
        split = check_split(split)
        if not self._cache:
            self._cache = self._load()
        return self._cache[split]

    def _load(self) -> dict[Split, list[TaskSample]]:
        train = load_samples(self._train_path, self._fields, uid_prefix="train")
        if self._eval_path:
            return {"train": train, "eval": load_samples(self._eval_path, self._fields, uid_prefix="eval")}
        is_eval = [held_out(s.prompt, seed=self._seed, fraction=self._eval_fraction) for s in train]
        splits: dict[Split, list[TaskSample]] = {
            "train": [s for s, e in zip(train, is_eval, strict=True) if not e],
            "eval": [s for s, e in zip(train, is_eval, strict=True) if e],
        }
        if not splits["train"] or not splits["eval"]:
            raise ValueError(
                f"{self._train_path}: holding out task.eval_fraction={self._eval_fraction} of "
                f"{len(train)} rows left an empty split; set task.eval_path or change task.eval_fraction"
            )
        return splits
