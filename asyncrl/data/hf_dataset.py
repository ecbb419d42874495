"""Rows of a Hugging Face ``datasets`` dataset: by hub name (``openai/gsm8k``), a ``save_to_disk`` directory or
a local data file.

Key decision: the dataset is only a source of rows; every row goes through the same validation as a JSONL or
Parquet row (``loader.row_to_sample``), so a bad row is the same named error whichever way the data came in.
A hub name goes through ``datasets.load_dataset`` online; offline (``HF_HUB_OFFLINE=1`` or
``task.local_files_only``) it is read from the repository snapshot in the hub cache (what ``hf download
--repo-type dataset`` and ``load_dataset`` itself fill), else from ``datasets``' own cache of an earlier load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asyncrl.hub import HubNotCachedError, offline, snapshot

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


def read_hub_rows(
    name: str, config: str, split: str, *, revision: str = "", local_files_only: bool = False
) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row) of ``split`` (any ``datasets`` split string: ``train``, ``test[:500]``) of
    config ``config`` ("" = the dataset's only or default one) of the hub dataset ``name`` at ``revision``."""
    try:
        loaded = _load_hub_split(name, config or None, split, revision or None, local_files_only)
    except HubNotCachedError:
        raise
    except (ValueError, FileNotFoundError, ConnectionError) as err:  # datasets' own: unknown config or split
        raise ValueError(f"task.dataset {name!r} (config {config!r}, split {split!r}): {err}") from err
    return enumerate(iter(loaded), start=1)


def _load_hub_split(
    name: str, config: str | None, split: str, revision: str | None, local_files_only: bool
) -> Any:
    import datasets

    if not offline(local_files_only):
        try:
            return datasets.load_dataset(name, config, split=split, revision=revision)
        except ConnectionError:  # the hub is unreachable: what the caches hold may still do
            pass
    try:
        directory = snapshot(
            name, repo_type="dataset", revision=revision or "", local_files_only=True, what="task.dataset"
        )
    except HubNotCachedError as not_in_hub_cache:
        if not datasets.config.HF_HUB_OFFLINE:  # it would go online: local_files_only forbids that
            raise
        try:  # an earlier online load_dataset left the prepared dataset in datasets' cache
            return datasets.load_dataset(name, config, split=split)
        except (ConnectionError, FileNotFoundError, ValueError) as err:
            raise HubNotCachedError(
                f"{not_in_hub_cache}; nor in the datasets cache {datasets.config.HF_DATASETS_CACHE} ({err})"
            ) from err
    return datasets.load_dataset(str(directory), config, split=split)
