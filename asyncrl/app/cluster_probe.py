"""``asyncrl doctor``'s probe of a Ray cluster: its resources, and on each node whether the files the run loads
resolve there, offline, as the run's actors resolve them.

Key decisions:
- Ray actors run with ``HF_HUB_OFFLINE=1`` (``runtime.ray_runtime.ACTOR_ENV``), so a node whose Hugging Face
  cache lacks the model (or whose disk lacks a model folder) fails only when its actor loads, minutes into the
  run. The probe runs ``resolve_here`` on each node, in the actors' environment (``runtime.node_probe``): it
  resolves each path through the loaders the run uses (``models.loading.resolve_model_path`` with
  ``local_files_only``, and ``load_tokenizer``), so its verdict and the run's cannot differ.
- It runs in a process of its own (``main``, one JSON line out): joining a cluster is one connection per
  process, and doctor's own process stays free of Ray.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
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


def resolve_here(items: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Run on a node: each item with ``ok`` and the directory it resolved to (``where``), or the ``error`` that
    stops it loading there."""
    from asyncrl.models.loading import load_tokenizer, resolve_model_path

    results = []
    for item in items:
        path, revision = item["path"], item["revision"]
        try:
            if item["what"] == "tokenizer":
                load_tokenizer(path, revision, local_files_only=True)
            where = resolve_model_path(path, revision, local_files_only=True, keys=KEYS[item["what"]])
        except Exception as err:  # a diagnosis: whatever stops the load on this node is the answer
            results.append({**item, "ok": False, "error": f"{type(err).__name__}: {err}"})
        else:
            results.append({**item, "ok": True, "where": str(where)})
    return results


def probe_args(config: RunConfig, accelerator: str) -> str:
    """The probe's one command-line argument for ``config``'s cluster (``accelerator``: see ``main``)."""
    items = [asdict(n) for n in needed(config)]
    return json.dumps({"address": config.runtime.address, "accelerator": accelerator, "items": items})


def main() -> None:
    """``python -c "from asyncrl.app.cluster_probe import main; main()" ARGS`` (``probe_args``): the cluster's
    resources and ``resolve_here`` on each node that holds ``accelerator`` (every node when empty), as one JSON
    line. (Not ``-m``: run as ``__main__``, ``resolve_here`` would travel to the nodes by value, not by name.)"""
    from asyncrl.runtime.node_probe import on_each_node

    args = json.loads(sys.argv[1])
    report = on_each_node(
        args["address"], args["accelerator"], resolve_here, (args["items"],), NODE_DEADLINE_S
    )
    print(json.dumps(report))
