"""Runtime config validation, placement arithmetic and Ray start-up arguments (pure: no Ray is started)."""

from __future__ import annotations

import pytest

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.runtime.placement import Placement, is_colocated, num_threads, plan_placement
from asyncrl.runtime.ray_runtime import ray_init_args, ray_session


def test_disjoint_shares_split_rollout_cpus_over_engines():
    config = RuntimeConfig(type="local", rollout_num_cpus=3, train_num_cpus=1.5)
    assert plan_placement(config, num_engines=2, mode="async") == Placement(
        colocated=False, engine_num_cpus=1.5, engine_threads=1, trainer_num_cpus=1.5, trainer_threads=1
    )
    assert plan_placement(config, num_engines=1, mode="one_step_off").engine_threads == 3


def test_sync_colocates_the_trainer_on_every_core_and_the_engines_on_all_but_the_drivers():
    config = RuntimeConfig(type="local", rollout_num_cpus=1, train_num_cpus=1)
    assert plan_placement(config, num_engines=1, mode="sync") == Placement(
        colocated=True, engine_num_cpus=0.0, engine_threads=1, trainer_num_cpus=0.0, trainer_threads=2
    )
    assert plan_placement(config, num_engines=4, mode="sync").engine_threads == 1
    sixteen = RuntimeConfig(type="local", rollout_num_cpus=8, train_num_cpus=8)
    assert plan_placement(sixteen, num_engines=1, mode="sync").engine_threads == 15
    assert plan_placement(sixteen, num_engines=2, mode="sync").engine_threads == 7
    one = RuntimeConfig(type="local", rollout_num_cpus=0.5, train_num_cpus=0.5)
    assert plan_placement(one, num_engines=1, mode="sync").engine_threads == 1


def test_driver_cpus_sets_what_colocated_engines_leave_to_the_driver():
    every_core = RuntimeConfig(type="local", rollout_num_cpus=1, train_num_cpus=1, driver_cpus=0)
    assert plan_placement(every_core, num_engines=1, mode="sync").engine_threads == 2
    assert plan_placement(every_core, num_engines=2, mode="sync").engine_threads == 1
    assert plan_placement(every_core, num_engines=1, mode="async").engine_threads == 1  # disjoint: not read
    with pytest.raises(ValueError, match="runtime.driver_cpus must be >= 0"):
        RuntimeConfig(driver_cpus=-1)


@pytest.mark.parametrize(
    ("colocate", "mode", "expected"),
    [
        ("auto", "sync", True),
        ("auto", "async", False),
        ("auto", "partial_rollout", False),
        ("always", "async", True),
        ("never", "sync", False),
    ],
)
def test_colocation_choice(colocate, mode, expected):
    assert is_colocated(RuntimeConfig(type="local", colocate=colocate), mode) is expected


def test_threads_round_down_with_float_slack_and_at_least_one():
    assert [num_threads(x) for x in (0.25, 1.0, 1 / 3 * 3, 1.99, 2.0, 7.5)] == [1, 1, 1, 1, 2, 7]


def test_plan_rejects_no_engines():
    with pytest.raises(ValueError, match="rollout.num_engines must be >= 1, got 0"):
        plan_placement(RuntimeConfig(type="local"), num_engines=0, mode="async")


ACTORS = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}
"""Every actor's environment: local models only, and no library progress bars (their output is Ray's log)."""


def test_local_ray_gets_rollout_plus_train_cpus_no_dashboard_and_auth_off_for_actors():
    args = ray_init_args(RuntimeConfig(type="local", rollout_num_cpus=1.5, train_num_cpus=1))
    assert args == {
        "address": "local",  # a Ray of its own, never another process's on this machine
        "num_cpus": 3,
        "include_dashboard": False,
        "runtime_env": {"env_vars": {**ACTORS, "RAY_AUTH_MODE": "disabled"}},
    }


def test_cluster_joins_the_address_and_leaves_its_auth_alone():
    args = ray_init_args(RuntimeConfig(type="cluster", address="ray://head:10001"))
    assert args == {"address": "ray://head:10001", "runtime_env": {"env_vars": ACTORS}}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "docker"}, "runtime.type must be one of 'inline', 'local', 'cluster', got 'docker'"),
        ({"type": "cluster"}, "runtime.address is required for runtime.type 'cluster' and only then"),
        ({"type": "local", "address": "auto"}, "runtime.address is required"),
        ({"colocate": "sometimes"}, "runtime.colocate must be one of 'auto', 'always', 'never'"),
        ({"rollout_num_cpus": 0}, "runtime.rollout_num_cpus must be > 0, got 0"),
        ({"train_num_cpus": -1}, "runtime.train_num_cpus must be > 0, got -1"),
        ({"generate_timeout_s": 0}, "runtime.generate_timeout_s must be > 0, got 0"),
    ],
)
def test_runtime_config_validation_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RuntimeConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "cores", "shares"),
    [
        ({}, 2, (1.0, 1.0)),  # this machine: one core per role
        ({}, 16, (8.0, 8.0)),
        ({}, 3, (2.0, 1.0)),  # the trainer takes the smaller half
        ({}, 1, (1.0, 1.0)),  # never below one each
        ({"rollout_num_cpus": 3}, 16, (3.0, 13.0)),
        ({"train_num_cpus": 4}, 16, (12.0, 4.0)),
        ({"rollout_num_cpus": 1.5, "train_num_cpus": 0.5}, 16, (1.5, 0.5)),
        ({"type": "cluster", "address": "auto"}, 16, (1.0, 1.0)),  # a cluster's cores are not this machine's
    ],
)
def test_cpu_shares_split_the_usable_cores_unless_set(kwargs, cores, shares):
    assert RuntimeConfig(**kwargs).cpu_shares(cores) == shares


def test_inline_runtime_needs_no_ray_session():
    session = ray_session(RuntimeConfig())
    with pytest.raises(ValueError, match="runtime.type 'inline' runs in one process"):
        session.__enter__()


@pytest.mark.parametrize("mode", ["async", "partial_rollout", "multi_version"])
def test_auto_colocates_any_mode_at_alpha_zero_as_sync(mode):
    """α = 0 never overlaps rollout with training: it gets sync's placement (and so sync's threads)."""
    config = RuntimeConfig(type="local")
    assert is_colocated(config, mode, async_ratio=0)
    assert not is_colocated(config, mode, async_ratio=1)
    assert plan_placement(config, num_engines=1, mode=mode, async_ratio=0) == plan_placement(
        config, num_engines=1, mode="sync", async_ratio=0
    )
