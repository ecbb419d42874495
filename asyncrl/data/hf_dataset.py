"""Rows of a Hugging Face ``datasets`` dataset on disk: a ``save_to_disk`` directory or a local data file.

Key decision: the dataset is only a source of rows; every row goes through the same validation as a JSONL or
Parquet row (``loader.row_to_sample``), so a bad row is the same named error whichever way the data came in.
Nothing is fetched from a hub: a path that is neither a saved dataset nor a local file is an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
"""Local data file suffix → the ``datasets`` builder that reads it."""


def read_dataset_rows(path: str | os.PathLike[str], split: str) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row) of ``split`` of the dataset at ``path``.

    A directory is opened with ``load_from_disk`` (a ``DatasetDict`` must hold ``split``; a single
    ``Dataset`` is its own only split); a ``.json/.jsonl/.parquet/.csv`` file with ``load_dataset``, whose one
    split is ``train``.
    """
    import datasets  # heavy: imported only when a dataset task is actually loaded

    path = Path(path)
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{path}: the dataset has no split {split!r}; it has {sorted(loaded)}")
            loaded = loaded[split]
        elif split != "train":
            raise ValueError(f"{path}: a single saved Dataset has only the split 'train', not {split!r}")
        return enumerate(iter(loaded), start=1)
    builder = DATA_FILE_BUILDERS.get(path.suffix)
    if builder is None:
        raise ValueError(
            f"{path}: not a saved dataset directory nor a data file ({', '.join(DATA_FILE_BUILDERS)})"
        )
    if not path.is_file():
        raise ValueError(f"{path}: dataset file not found")
    if split != "train":
        raise ValueError(f"{path}: a data file has only the split 'train', not {split!r}")
    loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
    return enumerate(iter(loaded), start=1)
