"""Hugging Face hub ids → directories in the standard hub cache, through ``huggingface_hub``.

Key decision: every loader in asyncrl works on a local directory. A hub id is turned into its cached snapshot
(``snapshot_download``: one pinned revision, the cache ``HF_HOME`` / ``HF_HUB_CACHE`` names, no network when
``HF_HUB_OFFLINE=1`` or ``local_files_only``) before anything reads it, so ``from_pretrained``, the vLLM worker
and the readers of ``config.json`` all see the same files at the same commit, and an offline miss is one named
error instead of a connection traceback from deep inside a loader.
"""

from __future__ import annotations

import functools
from pathlib import Path

MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken")
"""What a causal LM needs from its repository: configs, safetensors weights, tokenizer and chat template files
(not the ``.bin`` / ``.pth`` copies many repositories also carry)."""
MODEL_IGNORE_PATTERNS = ("original/*",)
"""Consolidated checkpoints for other runtimes (Llama's ``original/``): never read here."""


class HubNotCachedError(FileNotFoundError):
    """A hub id asked for offline (or unreachable) is not in the cache."""


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is shaped like a hub repository id (``org/name`` or ``name``), not a filesystem path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def offline(local_files_only: bool) -> bool:
    """Whether downloads are off: asked for (``local_files_only``) or by ``HF_HUB_OFFLINE=1``."""
    from huggingface_hub import constants

    return local_files_only or constants.HF_HUB_OFFLINE


def hub_cache_dir() -> Path:
    """The hub cache this process uses (``HF_HUB_CACHE``, else ``$HF_HOME/hub``), read when called."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def snapshot(
    repo_id: str,
    *,
    repo_type: str = "model",
    revision: str = "",
    local_files_only: bool = False,
    allow_patterns: tuple[str, ...] | None = None,
    ignore_patterns: tuple[str, ...] | None = None,
    what: str = "model.path",
) -> Path:
    """The cached snapshot directory of ``repo_id`` at ``revision`` (a branch, tag or commit; empty: ``main``),
    downloaded into the hub cache unless offline. ``HubNotCachedError`` names the id, the revision and the
    cache looked in when it is not there and cannot be fetched."""
    return _snapshot(
        repo_id,
        repo_type,
        revision or "main",
        offline(local_files_only),
        allow_patterns,
        ignore_patterns,
        what,
        str(hub_cache_dir()),
    )


@functools.lru_cache(maxsize=32)
def _snapshot(
    repo_id: str,
    repo_type: str,
    revision: str,
    files_only: bool,
    allow_patterns: tuple[str, ...] | None,
    ignore_patterns: tuple[str, ...] | None,
    what: str,
    cache_dir: str,
) -> Path:
    """One resolution per process and cache (online, each costs a round trip to the hub)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        path = snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=files_only,
            allow_patterns=list(allow_patterns) if allow_patterns else None,
            ignore_patterns=list(ignore_patterns) if ignore_patterns else None,
        )
    except LocalEntryNotFoundError as err:
        how = (
            "downloads are off (HF_HUB_OFFLINE=1 or local_files_only)"
            if files_only
            else "the hub could not be reached"
        )
        fetch = f"hf download {'--repo-type dataset ' if repo_type == 'dataset' else ''}{repo_id}"
        raise HubNotCachedError(
            f"{what}: {repo_type} {repo_id!r} at revision {revision!r} is not in the Hugging Face cache "
            f"{cache_dir} and {how}; fetch it on a connected machine (`{fetch} --revision {revision}`, with "
            "the same HF_HOME) or point HF_HOME / HF_HUB_CACHE at a cache that holds it"
        ) from err
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise HubNotCachedError(
            f"{what}: {repo_type} {repo_id!r} at revision {revision!r} does not exist on the hub "
            f"(or needs a token: HF_TOKEN): {type(err).__name__}"
        ) from err
    return Path(path)
