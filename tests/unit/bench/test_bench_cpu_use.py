"""bench/cpu_use.py: mean cores per part between two snapshots, and which pids a run's roles have."""

from __future__ import annotations

import os
import time

import pytest

from bench import cpu_use


def test_cores_used_splits_the_machine_between_parts_and_other() -> None:
    start = {"driver": 1.0, "engine": 10.0, "trainer": 5.0, "machine": 100.0}
    end = {"driver": 2.0, "engine": 13.0, "trainer": 7.0, "machine": 107.0}
    used = cpu_use.cores_used(start, end, wall_s=4.0)
    assert used == pytest.approx(
        {"cores_driver": 0.25, "cores_engine": 0.75, "cores_trainer": 0.5, "cores_other": 0.25}
    )


def test_inline_runs_have_no_role_processes_and_ray_runs_name_theirs() -> None:
    assert cpu_use.role_pids({"runtime": "inline", "pid": 7}) == {}
    ray = {"runtime": "local", "trainer_ranks": [{"pid": 3}, {"pid": 4}], "engines": [{"pid": 5}]}
    assert cpu_use.role_pids(ray) == {"trainer": [3, 4], "engine": [5]}


def test_a_snapshot_counts_this_process_and_the_machine() -> None:
    """CPU time advances in clock ticks (10 ms), and on a busy machine a fixed amount of work may not yet show:
    work until it does (with a deadline); the two reads of one process may straddle a tick."""
    first = cpu_use.snapshot({"engine": [os.getpid()]})
    deadline = time.monotonic() + 60
    while cpu_use.snapshot({})["driver"] <= first["driver"]:
        assert time.monotonic() < deadline, "no CPU time counted for this process in 60 s"
        sum(i * i for i in range(100_000))
    second = cpu_use.snapshot({"engine": [os.getpid()]})
    assert second["driver"] > first["driver"]
    assert second["engine"] == pytest.approx(second["driver"], abs=0.05)
    assert second["machine"] >= first["machine"]
