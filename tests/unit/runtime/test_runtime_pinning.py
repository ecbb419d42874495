"""runtime.pin_cores: disjoint placements pin trainer and engines to disjoint cores; sync stays unpinned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.runtime.placement import plan_placement


def test_trainer_and_engines_get_disjoint_cores() -> None:
    config = RuntimeConfig(type="local", rollout_num_cpus=3, train_num_cpus=1, pin_cores=True)
    placement = plan_placement(config, num_engines=2, mode="async", usable_cores=[4, 5, 6, 7])
    assert placement.trainer_cores == (4,)
    assert placement.engine_cores == ((5, 6), (7,))
    half = RuntimeConfig(type="local", rollout_num_cpus=1, train_num_cpus=1, pin_cores=True)
    assert plan_placement(half, num_engines=2, mode="async", usable_cores=[0, 1]).engine_cores == ((1,), (1,))


def test_sync_and_unpinned_runs_get_no_cores() -> None:
    pinned = RuntimeConfig(type="local", pin_cores=True)
    assert plan_placement(pinned, num_engines=1, mode="sync", usable_cores=[0, 1]).trainer_cores == ()
    plain = plan_placement(RuntimeConfig(type="local"), num_engines=1, mode="async", usable_cores=[0, 1])
    assert plain.trainer_cores == () and plain.engine_cores == ()


def test_more_cpus_than_cores_is_an_error_naming_the_fields() -> None:
    config = RuntimeConfig(type="local", rollout_num_cpus=2, train_num_cpus=1, pin_cores=True)
    with pytest.raises(ValueError, match="runtime.train_num_cpus \\+ runtime.rollout_num_cpus"):
        plan_placement(config, num_engines=1, mode="async", usable_cores=[0, 1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_pin_sets_the_process_affinity() -> None:
    core = min(os.sched_getaffinity(0))
    code = f"import os; from asyncrl.runtime.placement import pin; pin(({core},)); print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[{core}]"
