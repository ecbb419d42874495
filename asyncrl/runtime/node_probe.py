"""A function run once on each node of a Ray cluster, in the environment the run's actors get: what
``asyncrl doctor`` asks every node before a run (``app.cluster_probe``), and what a cluster run asks at its
start (``runtime.start_files``).

Key decisions: the call runs in the actors' environment (``actor_env.ACTOR_ENV`` as the job's environment, so
``HF_HUB_OFFLINE=1`` there too); each node's call is a zero-CPU task pinned to it (``NodeAffinitySchedulingStrategy``,
not soft), so a busy cluster still answers; every answer has one deadline, and a node that misses it, or whose
task raised, is reported as such beside the others rather than failing the whole probe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from asyncrl.runtime.actor_env import ACTOR_ENV


def on_each_node(
    address: str, accelerator: str, fn: Callable[..., Any], args: tuple[Any, ...], deadline_s: float
) -> dict[str, Any]:
    """Join the cluster at ``address`` as a run does; its resources, and ``each_node``'s answers."""
    ray.init(
        address=address,
        runtime_env={"env_vars": dict(ACTOR_ENV)},
        logging_level="ERROR",
        log_to_driver=False,
    )
    try:
        return {"resources": ray.cluster_resources(), "nodes": each_node(accelerator, fn, args, deadline_s)}
    finally:
        ray.shutdown()


def each_node(
    accelerator: str, fn: Callable[..., Any], args: tuple[Any, ...], deadline_s: float
) -> list[dict[str, Any]]:
    """In a joined session: ``fn(*args)`` on every live node (those holding the resource ``accelerator`` when it
    is named: the nodes the run's actors can be placed on), each as ``{"node": "IP (node ID…)", "answer": ...}``
    or ``{"node": ..., "error": ...}``, all within ``deadline_s``."""
    nodes = [
        n for n in ray.nodes() if n["Alive"] and (not accelerator or n["Resources"].get(accelerator, 0) > 0)
    ]
    task = ray.remote(num_cpus=0)(fn)
    pending = {}
    for node in nodes:
        pinned = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        pending[task.options(scheduling_strategy=pinned).remote(*args)] = node
    ready = ray.wait(list(pending), num_returns=len(pending), timeout=deadline_s)[0] if pending else []
    report = []
    for ref, node in pending.items():
        name = f"{node['NodeManagerAddress']} (node {node['NodeID'][:8]})"
        if ref not in ready:
            ray.cancel(ref, force=True)
            report.append({"node": name, "error": f"no answer in {deadline_s:.0f} s"})
            continue
        try:
            report.append({"node": name, "answer": ray.get(ref)})
        except Exception as err:  # e.g. asyncrl not importable there: that node's answer, not the probe's
            report.append({"node": name, "error": f"{type(err).__name__}: {err}"})
    return report
