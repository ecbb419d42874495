"""The model files a run's actors load, named by the config keys that name them, and their resolution.

Key decision: one list (``needed``) and one resolution (``resolve``, through the loaders the run uses:
``models.loading.resolve_model_path`` and ``load_tokenizer``) serve both the driver, which resolves them
before any actor starts (downloading unless offline, ``runtime.ray_runtime.build_ray_parts``), and each
node's offline check (``resolve_here``: at a cluster run's start and in ``asyncrl doctor``), so what is
checked and what the actors later load cannot differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config.critic import CRITIC_KEYS
from asyncrl.config.model import MODEL_KEYS, ModelKeys
from asyncrl.config.run import RunConfig

NODE_DEADLINE_S = 120.0
"""How long each node's check may take: a fresh worker process in the actors' environment, importing torch and
transformers, then resolving a few paths (seconds on a warm node)."""


@dataclass(frozen=True)
class Needed:
    """One thing the run loads on the nodes its actors run on: the config key that names it, and its path."""

    what: str
    """``model.path``, ``tokenizer`` (``model.path``'s) or ``critic.model_path``."""
    path: str
    revision: str
    """``model.revision`` for the policy and its tokenizer, ``critic.revision`` for the critic's body."""


KEYS: dict[str, ModelKeys] = {
    "model.path": MODEL_KEYS,
    "tokenizer": MODEL_KEYS,
    "critic.model_path": CRITIC_KEYS,
}
"""The config keys a failure to resolve each ``Needed.what`` names (a critic's is not the policy's)."""


def needed(config: RunConfig) -> list[Needed]:
    """What the actors load: the policy (the reference copy is its frozen twin, from the same files), its
    tokenizer, and a separate critic's body when ``critic.model_path`` names one (at ``critic.revision``, as
    ``trainer.factory`` loads it)."""
    model = config.model
    items = [
        Needed("model.path", model.path, model.revision),
        Needed("tokenizer", model.path, model.revision),
    ]
    critic = config.critic
    if critic is not None and critic.model_path is not None:
        items.append(Needed("critic.model_path", critic.model_path, critic.revision))
    return items


def resolve(item: Needed, *, local_files_only: bool) -> Path:
    """The directory ``item`` loads from, in this process's hub cache (downloaded into it unless
    ``local_files_only`` or ``HF_HUB_OFFLINE=1``); a tokenizer is also loaded, as the run loads it. Errors
    (``HubNotCachedError``, ``FileNotFoundError``, ...) name ``item``'s config keys."""
    from asyncrl.models.loading import load_tokenizer, resolve_model_path

    keys = KEYS[item.what]
    where = resolve_model_path(item.path, item.revision, local_files_only=local_files_only, keys=keys)
    if item.what == "tokenizer":
        load_tokenizer(item.path, item.revision, local_files_only=local_files_only)
    return where


def resolve_all(config: RunConfig) -> list[Path]:
    """Resolve every file the run's actors load, here (the driver), before any starts: downloads happen in this
    process (``model.local_files_only`` and ``HF_HUB_OFFLINE`` as it sees them), never in an actor, whose
    environment is offline; a model that cannot be had fails here by its config key."""
    return [resolve(item, local_files_only=config.model.local_files_only) for item in needed(config)]


def resolve_here(items: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Run on a node: each item (a ``Needed`` as a dict) with ``ok`` and the directory it resolved to
    (``where``), or the ``error`` that stops it loading there, offline as the actors load it."""
    results = []
    for item in items:
        try:
            where = resolve(Needed(**item), local_files_only=True)
        except Exception as err:  # a diagnosis: whatever stops the load on this node is the answer
            results.append({**item, "ok": False, "error": f"{type(err).__name__}: {err}"})
        else:
            results.append({**item, "ok": True, "where": str(where)})
    return results
