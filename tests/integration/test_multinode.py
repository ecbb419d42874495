"""Two Ray nodes on one machine (``ray.cluster_utils.Cluster``), a custom resource standing in for GPUs: the
trainer ranks and the engines land on the nodes the placement names, weights flow, and an async (α = 2) RL run
of 10 steps completes with a 2-rank FSDP2 trainer; a placement the cluster cannot hold fails in seconds, named.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.runtime.placement_check import PlacementError
from asyncrl.runtime.ray_runtime import build_ray_parts

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a two-node cluster: 10-15 s a test

NUM_STEPS = 10


@pytest.fixture(scope="module")
def cluster():
    """A head node for the trainer and a second node for rollout, each with 2 stand-in GPUs."""
    if ray.is_initialized():
        ray.shutdown()
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"trainer_node": 2, "fake_gpu": 2}},
    )
    nodes.add_node(num_cpus=2, resources={"rollout_node": 2, "fake_gpu": 2})
    ray.init(address=nodes.address)
    nodes.wait_for_nodes()
    yield nodes
    ray.shutdown()
    nodes.shutdown()


def _overrides(cluster: Cluster, tiny_path: Path, out: Path) -> list[str]:
    return [
        f"model.path={tiny_path}",
        "model.device=cpu",
        f"output_dir={out}",
        "runtime.type=cluster",
        f"runtime.address={cluster.address}",
        "runtime.accelerator_resource=fake_gpu",
        "runtime.accelerators_per_trainer_worker=1",
        "runtime.accelerators_per_engine=1",
        "runtime.trainer_resources.trainer_node=1",
        "runtime.engine_resources.rollout_node=1",
        "runtime.train_num_cpus=1",
        "runtime.rollout_num_cpus=1",
        "runtime.placement_timeout_s=20",
        "runtime.reward_num_cpus=0.5",  # the driver-side reward pool reserves its cores too
        "trainer.num_workers=2",
        "trainer.lr=1e-3",
        "rollout.num_engines=2",
        "rollout.rollout_batch_size=2",
        "rollout.num_return_sequences=3",
        "rollout.max_new_tokens=12",
        "engine.max_model_len=256",
        "engine.max_kv_tokens=2048",
        "task.num_train=200",
        "task.num_eval=8",
        "controller.mode=async",
        "buffer.async_ratio=2",
        f"controller.num_steps={NUM_STEPS}",
        "controller.eval_prompts=0",
        "reward.name=test_modes:length_reward",
    ]


def _node_of(cluster: Cluster, resource: str) -> str:
    return next(node["NodeID"] for node in ray.nodes() if node["Alive"] and resource in node["Resources"])


def test_roles_land_on_their_nodes_and_an_async_run_completes(cluster, tiny_path, tmp_path):
    config = load_run_config(None, _overrides(cluster, tiny_path, tmp_path))
    summary = asyncio.run(training.train(config, console=None))
    assert summary.steps == NUM_STEPS
    placed = json.loads((tmp_path / "placement.json").read_text())
    trainer_node, rollout_node = _node_of(cluster, "trainer_node"), _node_of(cluster, "rollout_node")
    assert [rank["node_id"] for rank in placed["trainer_ranks"]] == [trainer_node] * 2
    assert [engine["node_id"] for engine in placed["engines"]] == [rollout_node] * 2
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines()]
    assert [line["train/version"] for line in lines] == [float(v) for v in range(1, NUM_STEPS + 1)]
    assert all(line["staleness/max"] <= 2 for line in lines)
    assert max(line["staleness/max"] for line in lines) >= 1  # it did run ahead of the trainer
    assert (Path(summary.checkpoint) / "sharded").is_dir()
    assert placed["placement"]["colocated"] is False


def test_an_unsatisfiable_placement_fails_in_seconds_by_name(cluster, tiny_path, tmp_path):
    overrides = [*_overrides(cluster, tiny_path, tmp_path), "rollout.num_engines=3"]  # 3 GPUs on a 2-GPU node
    config = load_run_config(None, overrides)
    started = time.monotonic()
    with pytest.raises(PlacementError, match=r"fake_gpu.*engines: 3 x"):
        build_ray_parts(config, config.runtime)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("mode", "path"),
    [
        (("controller.mode=async",), "staged"),
        (("controller.mode=sync", "buffer.async_ratio=0", "runtime.colocate=never"), "streamed"),
    ],
    ids=["staged", "streamed"],
)
def test_weights_broadcast_from_trainer_rank_0_to_engines_on_another_node(
    cluster, tiny_path, tmp_path, mode, path
):
    """The broadcast transport across the two nodes: trainer rank 0 sends each bucket once over a gloo group
    with both engines, which stage it and apply it when the proxy updates them (async mode), or apply each
    bucket as it arrives (sync mode; ``weight_sync.broadcast_apply``); every step trains."""
    overrides = [
        *_overrides(cluster, tiny_path, tmp_path),
        "weight_sync.type=broadcast",
        "proxy.max_engine_restarts=0",
        "controller.num_steps=4",
        *mode,
    ]
    config = load_run_config(None, overrides)
    assert config.broadcast_apply() == path
    summary = asyncio.run(training.train(config, console=None))
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines()]
    assert [line["train/version"] for line in lines] == [1.0, 2.0, 3.0, 4.0]
    assert all(line["staleness/max"] <= 2 for line in lines)


def test_a_critic_trains_on_two_fsdp_ranks_and_only_the_policy_is_synced(cluster, tiny_path, tmp_path):
    """PPO with a separate critic under a 2-rank FSDP2 trainer: values and GAE on every step, the critic in the
    sharded checkpoint, and the engines' weights updated from the policy alone (engines refuse a payload with a
    name they lack before copying anything, so a completed run shows no critic tensor travelled)."""
    overrides = [
        *_overrides(cluster, tiny_path, tmp_path),
        "controller.num_steps=3",
        "advantage.name=gae",
        "critic.type=separate",
        "critic.lr=1e-3",
    ]
    summary = asyncio.run(training.train(load_run_config(None, overrides), console=None))
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines()]
    assert [line["train/version"] for line in lines] == [1.0, 2.0, 3.0]
    assert all("train/critic/value_loss" in line for line in lines)
    assert lines[-1]["train/critic/values_mean"] != 0.0  # the zero-initialised head has learned
    sharded = Path(summary.checkpoint) / "sharded"
    assert (
        sharded.is_dir() and not (Path(summary.checkpoint) / "critic").exists()
    )  # the critic is in the shards
