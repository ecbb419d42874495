"""A Hugging Face hub cache written by hand, in the layout ``huggingface_hub`` downloads into, so hub ids (models
and datasets) resolve offline in tests exactly as a cache filled by ``hf download`` does.

Layout (``huggingface_hub``'s cache-system docs)::

    <cache>/<models|datasets>--<org>--<name>/
        blobs/<sha256 of the file>
        refs/<branch>                      (the commit the branch points at)
        snapshots/<commit>/<path>  ->  ../../blobs/<sha256>   (relative symlinks)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_hub_repo(
    cache_dir: str | os.PathLike[str],
    repo_id: str,
    files: Mapping[str, bytes],
    *,
    repo_type: str = "model",
    branch: str = "main",
    commit: str = "",
) -> str:
    """Write ``files`` (repository path → bytes) as one commit of ``repo_id`` that ``branch`` points at; returns
    the commit hash (derived from the contents unless ``commit`` is given)."""
    digest = hashlib.sha1(repo_id.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    commit = commit or digest.hexdigest()
    repo = Path(cache_dir) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, link.parent))
    return commit


def write_hub_model(
    cache_dir: str | os.PathLike[str], repo_id: str, model_dir: str | os.PathLike[str], **kwargs: str
) -> str:
    """Every file of the model directory ``model_dir`` as a commit of the model repository ``repo_id``."""
    root = Path(model_dir)
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    return write_hub_repo(cache_dir, repo_id, files, **kwargs)


def write_hub_dataset(
    cache_dir: str | os.PathLike[str],
    repo_id: str,
    configs: Mapping[str, Mapping[str, list[dict]]],
    **kwargs: str,
) -> str:
    """A dataset repository laid out as the hub's parquet datasets are (``openai/gsm8k``): one folder of
    ``<split>-00000-of-00001.parquet`` files per config, declared in the README's ``configs`` metadata, which
    is what ``datasets.load_dataset`` reads to find a config's splits. ``configs``: config → split → rows."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    files: dict[str, bytes] = {}
    card = ["---", "configs:"]
    for config, splits in configs.items():
        card += [f"- config_name: {config}", "  data_files:"]
        for split, rows in splits.items():
            path = f"{config}/{split}-00000-of-00001.parquet"
            buffer = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows), buffer)
            files[path] = buffer.getvalue()
            card += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    files["README.md"] = "\n".join(card + ["---", ""]).encode()
    return write_hub_repo(cache_dir, repo_id, files, repo_type="dataset", **kwargs)


def use_offline_cache(monkeypatch: Any, root: str | os.PathLike[str]) -> Path:
    """Point this process's hub cache (and ``datasets``' cache) under ``root`` and turn downloads off, as
    ``HF_HOME=root HF_HUB_OFFLINE=1`` would at start-up (both libraries read those once, at import); returns
    the (new, empty) hub cache. ``monkeypatch`` (pytest's) undoes it all after the test."""
    import datasets
    from huggingface_hub import constants

    cache = Path(root) / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(root) / "datasets")
    return cache
