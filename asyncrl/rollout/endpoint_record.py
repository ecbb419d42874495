"""What an external-producer run keeps on disk about its endpoint, so a harness outlives a trainer restart.

Two files in the run's ``output_dir``:

- ``endpoint.json`` — ``{"url": ".../v1"}``, written (atomically) once the endpoint serves, removed when the
  run ends; its port is the one every later attempt of the run binds again (``keep_port``), so the URL a
  harness holds stays right across a ``TrainerDied`` restart.
- ``endpoint_trajectories.jsonl`` — one line per trajectory the endpoint admitted (its id and group). A
  restarted attempt, or a ``resume=`` of the run, refuses to continue any of them (``TrajectoryLedger``):
  the new attempt holds none of their tokens, so a continuing call would turn the whole episode, the
  model's earlier turns included, into an untrained prompt, and its group would re-form with members cut
  short (a 409 ``run_restarted`` instead; the harness starts the episode over under a new id).

Key decision: the ledger refuses what *an earlier attempt* admitted, never what the current one did, and
only trajectories that were admitted (had tokens generated): one that was still waiting for its group's
admission ticket when the attempt died generated nothing, and may start afresh under its own id.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from asyncrl.config.serve import ServeConfig

ENDPOINT_FILE = "endpoint.json"
LEDGER_FILE = "endpoint_trajectories.jsonl"
RESTARTED = "run_restarted"
"""The ``code`` of the 409 a call on an earlier attempt's trajectory or group gets."""


def publish(output_dir: Path, url: str) -> None:
    """Write ``endpoint.json`` for ``url`` in one rename, so a harness polling it never reads half a file."""
    output_dir.mkdir(parents=True, exist_ok=True)
    partial = output_dir / (ENDPOINT_FILE + ".partial")
    partial.write_text(json.dumps({"url": url}))
    os.replace(partial, output_dir / ENDPOINT_FILE)


def withdraw(output_dir: Path) -> None:
    """Remove ``endpoint.json``: the run no longer serves (a harness reading no file knows it ended)."""
    (output_dir / ENDPOINT_FILE).unlink(missing_ok=True)


def start_run(output_dir: Path, *, resuming: bool) -> None:
    """A run starts: an ``endpoint.json`` left by an earlier process is removed (its URL is dead); the
    ledger is kept on ``resume=`` (the earlier process's trajectories cannot be continued) and removed
    otherwise (a fresh run in the same directory owes nothing to the last one)."""
    withdraw(output_dir)
    if not resuming:
        (output_dir / LEDGER_FILE).unlink(missing_ok=True)


def keep_port(serve: ServeConfig, output_dir: Path) -> ServeConfig:
    """``serve`` for the run's next attempt: with ``port: 0`` the port the endpoint bound so far
    (``endpoint.json``), so the URL does not change; unchanged if it never served or names its port."""
    path = output_dir / ENDPOINT_FILE
    if serve.port != 0 or not path.exists():
        return serve
    port = urlsplit(json.loads(path.read_text())["url"]).port
    return serve if port is None else replace(serve, port=port)


class TrajectoryLedger:
    """The trajectories and groups earlier attempts of the run admitted (refused by ``check``), and the
    file this attempt appends its own to."""

    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / LEDGER_FILE
        self.trajectories: set[str] = set()
        self.groups: set[str] = set()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.trajectories.add(record["trajectory"])
                    if record["group"] is not None:
                        self.groups.add(record["group"])

    def record(self, trajectory_id: str, group_id: str | None) -> None:
        """This attempt admitted ``trajectory_id``: a later attempt refuses it (flushed now, so a process
        killed outright leaves it recorded for ``resume=``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps({"trajectory": trajectory_id, "group": group_id}) + "\n")

    def check(self, trajectory_id: str, group_id: str | None) -> None:
        """409 ``run_restarted`` for a trajectory or group an earlier attempt admitted."""
        # here, not at the top: app.train imports this module, and a run without the endpoint needs no server
        # libraries (pydantic; tests/unit/test_architecture.py)
        from asyncrl.serve.schemas import ServeError

        if trajectory_id in self.trajectories:
            raise ServeError(
                409,
                f"trajectory {trajectory_id!r} began before the run restarted from its checkpoint; the "
                "restarted run holds none of its tokens and cannot continue it: start the episode over "
                "under a new trajectory id",
                "trajectory_id",
                "conflict_error",
                RESTARTED,
            )
        if group_id is not None and group_id in self.groups:
            raise ServeError(
                409,
                f"group {group_id!r} began before the run restarted from its checkpoint; its episodes "
                "were not trained: start the whole group over under a new group id",
                "group_id",
                "conflict_error",
                RESTARTED,
            )
