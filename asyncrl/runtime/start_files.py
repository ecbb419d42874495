"""Every model file a Ray run's actors load is had before any actor starts, or the run fails naming it.

Key decisions:
- Actors run offline (``actor_env.ACTOR_ENV``: ``HF_HUB_OFFLINE=1``), so a model they cannot find in their cache
  would fail deep in a trainer rank or an engine, minutes in, after its peers reserved devices. The driver
  resolves the policy, its tokenizer and a separate critic's body at their revisions first
  (``models.run_files.resolve_all``), downloading what is missing into its own cache unless it is offline
  itself (``HF_HUB_OFFLINE=1`` in its environment, or ``model.local_files_only``); offline and missing, the
  run fails here, by config key.
- ``local``: the actors are this machine's processes with the driver's environment, so they read the cache the
  driver filled; nothing more to check.
- ``cluster``: the driver's cache is one machine's. Each node the actors can be placed on (those holding
  ``runtime.accelerator_resource``; every node when the model runs on CPU, as ``asyncrl doctor`` picks them) runs
  the actors' own offline resolution (``models.run_files.resolve_here``), and any node that cannot load a file
  fails the start with ``ModelFilesError`` naming the node, the config key and the cause. Nothing is downloaded
  on the nodes: fill their caches (or share one, ``HF_HOME`` on a mount every node sees) before the run.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.models.run_files import NODE_DEADLINE_S, needed, resolve_all, resolve_here
from asyncrl.runtime.node_probe import each_node


class ModelFilesError(RuntimeError):
    """A file the run's actors load does not load on a node they can be placed on (named: node, key, cause)."""


NODE_FIX = (
    "fetch it into that node's Hugging Face cache (hf download ID --revision REV, with the HF_HOME its Ray "
    "workers read), or point HF_HOME at a cache every node mounts; a model folder must exist at the same path "
    "on every node. `asyncrl doctor` checks every node before a run"
)


def resolve_before_start(config: RunConfig, runtime: RuntimeConfig) -> None:
    """Have every file the actors load before any actor starts (see the module docstring); on a cluster, inside
    a joined Ray session."""
    resolve_all(config)
    if runtime.type == "cluster":
        check_nodes(config, runtime)


def check_nodes(config: RunConfig, runtime: RuntimeConfig) -> None:
    """``ModelFilesError`` unless each node the actors can be placed on loads every file offline."""
    items = [asdict(item) for item in needed(config)]
    accelerator = runtime.accelerator_resource if config.model.device != "cpu" else ""
    failures = node_failures(each_node(accelerator, resolve_here, (items,), NODE_DEADLINE_S))
    if failures:
        raise ModelFilesError(
            "model files do not load offline where the run's actors can be placed:\n  "
            + "\n  ".join(failures)
            + f"\n{NODE_FIX}"
        )


def node_failures(nodes: list[dict[str, Any]]) -> list[str]:
    """One line per node and file that does not load there (``node_probe.each_node``'s report of
    ``resolve_here``), or per node whose check did not run."""
    failures = []
    for node in nodes:
        if "error" in node:
            failures.append(f"node {node['node']}: the check did not run there: {node['error']}")
            continue
        for item in node["answer"]:
            if not item["ok"]:
                at = f" at revision {item['revision']!r}" if item["revision"] else ""
                failures.append(f"node {node['node']}: {item['what']} {item['path']!r}{at}: {item['error']}")
    return failures
