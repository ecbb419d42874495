"""Where a run's CPU went: seconds of CPU used by the driver, by each role's processes, and by the machine as a
whole, so a benchmark can say which part took the cores a role was meant to have.

Why it exists: on a small machine an async arm's engine and trainer each get a core, but the driver process
(producer, proxy, reward scoring, Ray calls) and the kernel need CPU too; without counting it, "the roles
slow each other down" is a guess. Snapshots are cumulative; ``cores_used`` turns two of them into the mean
number of cores each part kept busy between them (``other``: the machine's busy time no counted process
explains — kernel threads, Ray's own daemons, anything else running).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import psutil

CpuSnapshot = dict[str, float]


def role_pids(locations: Mapping[str, object]) -> dict[str, list[int]]:
    """The pids of the trainer ranks and engines of a Ray run (``parts.locations()``); empty for an inline run,
    whose roles are threads of the driver."""
    if locations.get("runtime") == "inline":
        return {}
    return {
        "trainer": [int(rank["pid"]) for rank in locations["trainer_ranks"]],
        "engine": [int(engine["pid"]) for engine in locations["engines"]],
    }


def snapshot(pids: Mapping[str, Sequence[int]]) -> CpuSnapshot:
    """CPU seconds used so far by this process (``driver``), by each role's processes, and by the machine."""
    out = {"driver": _process_seconds(os.getpid())}
    for role, ids in pids.items():
        out[role] = sum(_process_seconds(pid) for pid in ids)
    machine = psutil.cpu_times()
    out["machine"] = sum(getattr(machine, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))
    return out


def cores_used(start: CpuSnapshot, end: CpuSnapshot, wall_s: float) -> dict[str, float]:
    """Mean cores each part kept busy between two snapshots ``wall_s`` apart, and ``other``: what the machine
    used beyond them."""
    used = {part: (end[part] - start[part]) / wall_s for part in end if part != "machine"}
    machine = (end["machine"] - start["machine"]) / wall_s
    return {
        **{f"cores_{part}": value for part, value in used.items()},
        "cores_other": machine - sum(used.values()),
    }


def _process_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system
