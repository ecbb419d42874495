"""The bundles each role asks for, from the config and the planned split (pure: no Ray cluster needed)."""

import pytest

from asyncrl.config.run import load_run_config
from asyncrl.runtime.placement import plan_placement
from asyncrl.runtime.placement_check import SHARED_ROLE, PlacementError, layout_of
from asyncrl.runtime.ray_placement import ENGINE_ROLE, TRAINER_ROLE, Reservation, role_bundles


def _bundles(*overrides: str) -> dict[str, tuple]:
    base = ["model.device=cpu", "runtime.type=local", "controller.mode=async", "buffer.async_ratio=1"]
    config = load_run_config(None, [*base, *overrides])
    placement = plan_placement(
        config.runtime,
        num_engines=config.rollout.num_engines,
        mode=config.controller.mode,
        num_trainer_workers=config.trainer.num_workers,
    )
    return {role.role: role.bundles for role in role_bundles(config, config.runtime, placement)}


def test_cpus_are_split_over_trainer_ranks_and_engines():
    bundles = _bundles(
        "trainer.num_workers=2",
        "rollout.num_engines=4",
        "runtime.train_num_cpus=2",
        "runtime.rollout_num_cpus=2",
    )
    assert bundles == {TRAINER_ROLE: ({"CPU": 1.0},) * 2, ENGINE_ROLE: ({"CPU": 0.5},) * 4}


def test_accelerators_and_node_resources_go_into_each_bundle():
    bundles = _bundles(
        "trainer.num_workers=2",
        "rollout.num_engines=1",
        "runtime.accelerator_resource=fake_gpu",
        "runtime.accelerators_per_trainer_worker=1",
        "runtime.accelerators_per_engine=2",  # a tensor-parallel engine: both GPUs in one bundle
        "runtime.trainer_resources.trainer_node=1",
        "runtime.engine_resources.rollout_node=1",
    )
    assert bundles[TRAINER_ROLE] == ({"CPU": 0.5, "fake_gpu": 1.0, "trainer_node": 1.0},) * 2
    assert bundles[ENGINE_ROLE] == ({"CPU": 1.0, "fake_gpu": 2.0, "rollout_node": 1.0},)


def test_vllm_tensor_parallelism_sets_an_engines_gpus_on_cuda():
    config = load_run_config(
        None, ["model.device=cuda", "engine.backend=vllm", "engine.vllm.tensor_parallel_size=4"]
    )
    from asyncrl.runtime.ray_placement import accelerators_per_actor

    assert accelerators_per_actor(config, config.runtime) == (1.0, 4.0)


def _roles(*overrides: str) -> list:
    config = load_run_config(None, ["model.device=cpu", "runtime.type=local", *overrides])
    placement = plan_placement(
        config.runtime,
        num_engines=config.rollout.num_engines,
        mode=config.controller.mode,
        num_trainer_workers=config.trainer.num_workers,
    )
    return role_bundles(config, config.runtime, placement)


SYNC_ON_GPUS = (
    "controller.mode=sync",
    "buffer.async_ratio=0",
    "runtime.accelerator_resource=fake_gpu",
    "runtime.accelerators_per_trainer_worker=1",
    "runtime.accelerators_per_engine=1",
)


def test_colocated_cpu_roles_reserve_nothing():
    assert _bundles("controller.mode=sync", "buffer.async_ratio=0") == {}
    assert layout_of([]).startswith("colocated on CPU")


def test_colocated_on_accelerators_pairs_each_engine_with_a_trainer_rank_in_one_bundle():
    (shared,) = _roles(*SYNC_ON_GPUS, "trainer.num_workers=2", "rollout.num_engines=2")
    assert shared.role == SHARED_ROLE and shared.bundles == ({"fake_gpu": 1.0},) * 2
    assert shared.shares == {TRAINER_ROLE: ({"fake_gpu": 0.5},) * 2, ENGINE_ROLE: ({"fake_gpu": 0.5},) * 2}
    assert layout_of([shared]).startswith("colocated on accelerators: 2 shared bundle(s)")


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("rollout.num_engines=2",), "rollout.num_engines=2, trainer.num_workers=1"),
        (("runtime.accelerators_per_engine=2",), "accelerators_per_engine=2"),
    ],
)
def test_colocated_asks_the_shared_layout_cannot_hold_are_refused_naming_why(overrides, named):
    with pytest.raises(PlacementError, match="pairs engine i with trainer rank i") as refused:
        _roles(*SYNC_ON_GPUS, *overrides)
    assert named in str(refused.value)


def test_an_actor_outside_any_reservation_asks_for_no_cpus():
    assert Reservation().options(ENGINE_ROLE, 0, "GPU") == {"num_cpus": 0}


def test_the_reward_pool_reserves_its_cpus_when_asked():
    bundles = _bundles("runtime.reward_num_cpus=1")
    assert bundles["reward"] == ({"CPU": 1.0},)
    assert "reward" not in _bundles()


def _switch_on_a_cluster(*overrides: str):
    config = load_run_config(
        None,
        [
            "model.device=cpu",
            "runtime.type=cluster",
            "runtime.address=auto",
            "runtime.switch.enabled=true",
            "controller.mode=sync",
            "buffer.async_ratio=0",
            *overrides,
        ],
    )
    placement = plan_placement(config.runtime, num_engines=1, mode="sync", num_trainer_workers=1)
    return config, role_bundles(config, config.runtime, placement)


def test_the_switch_on_a_cluster_needs_the_shared_bundle_and_takes_colocated_weights():
    from asyncrl.runtime.ray_runtime import check_switch_layout

    config, roles = _switch_on_a_cluster(*SYNC_ON_GPUS)
    check_switch_layout(config, config.runtime, roles)  # one bundle, one machine: accepted
    assert config.weight_sync.transport_for("cluster", switch=True) == "colocated"
    config, roles = _switch_on_a_cluster()  # CPU only: nothing reserved, so nothing keeps the pair together
    with pytest.raises(PlacementError, match="colocated on CPU.* refused: runtime.switch on a cluster needs"):
        check_switch_layout(config, config.runtime, roles)
