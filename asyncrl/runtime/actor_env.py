"""The environment every Ray actor and node task of a run gets (``ray.init``'s ``runtime_env``), in a module of
its own so the run (``ray_runtime``) and the per-node checks it and doctor make (``node_probe``) share it
without importing each other."""

from __future__ import annotations

from asyncrl.metrics.progress import LIBRARY_BARS

ACTOR_ENV = {"HF_HUB_OFFLINE": "1", **{switch: "1" for switch, _, _ in LIBRARY_BARS}}
"""Environment of every actor process: models load from local directories only (the driver resolves them
before any actor starts, ``runtime.start_files``), and libraries draw no progress bars (an actor's output
reaches the driver through Ray's log lines, never a terminal: a bar's carriage-return redraws would land in the
driver's log as noise)."""
