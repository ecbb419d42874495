"""``asyncrl doctor``'s probe of a Ray cluster: its resources, and on each node whether the files the run loads
resolve there, offline, as the run's actors resolve them.

Key decisions:
- Ray actors run with ``HF_HUB_OFFLINE=1`` (``runtime.actor_env.ACTOR_ENV``), so a node whose Hugging Face
  cache lacks the model (or whose disk lacks a model folder) cannot load it. The probe runs
  ``models.run_files.resolve_here`` on each node, in the actors' environment (``runtime.node_probe``), the same
  check a cluster run makes at its start (``runtime.start_files``), so doctor's verdict and the run's cannot
  differ; doctor only says it before the run reserves anything.
- It runs in a process of its own (``main``, one JSON line out): joining a cluster is one connection per
  process, and doctor's own process stays free of Ray.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from asyncrl.config.run import RunConfig
from asyncrl.models.run_files import NODE_DEADLINE_S, needed, resolve_here

__all__ = ["NODE_DEADLINE_S", "main", "probe_args", "resolve_here"]


def probe_args(config: RunConfig, accelerator: str) -> str:
    """The probe's one command-line argument for ``config``'s cluster (``accelerator``: see ``main``)."""
    items = [asdict(n) for n in needed(config)]
    return json.dumps({"address": config.runtime.address, "accelerator": accelerator, "items": items})


def main() -> None:
    """``python -c "from asyncrl.app.cluster_probe import main; main()" ARGS`` (``probe_args``): the cluster's
    resources and ``resolve_here`` on each node that holds ``accelerator`` (every node when empty), as one JSON
    line."""
    from asyncrl.runtime.node_probe import on_each_node

    args = json.loads(sys.argv[1])
    report = on_each_node(
        args["address"], args["accelerator"], resolve_here, (args["items"],), NODE_DEADLINE_S
    )
    print(json.dumps(report))
