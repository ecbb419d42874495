"""Colocated sync on a Ray cluster whose one stand-in GPU (a custom resource) a trainer rank and an engine
share: one placement bundle holds both actors, each with half the device, and a sync run trains through it."""

from __future__ import annotations

import asyncio
import json

import pytest
from ray.util.placement_group import placement_group_table

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a Ray cluster and two actors: ~15 s


def test_a_trainer_rank_and_an_engine_share_one_bundle_and_train(one_gpu_cluster, tiny_path, tmp_path):
    overrides = [
        f"model.path={tiny_path}",
        "model.device=cpu",
        f"output_dir={tmp_path}",
        "runtime.type=cluster",
        f"runtime.address={one_gpu_cluster.address}",
        "runtime.accelerator_resource=fake_gpu",
        "runtime.accelerators_per_trainer_worker=1",
        "runtime.accelerators_per_engine=1",
        "runtime.placement_timeout_s=20",
        "controller.mode=sync",
        "buffer.async_ratio=0",
        "controller.num_steps=2",
        "controller.eval_prompts=0",
        "rollout.rollout_batch_size=2",
        "rollout.num_return_sequences=2",
        "rollout.max_new_tokens=8",
        "engine.max_model_len=128",
        "task.num_train=40",
        "task.num_eval=4",
    ]
    config = load_run_config(None, overrides)
    summary = asyncio.run(training.train(config, console=None))
    assert summary.steps == 2
    placed = json.loads((tmp_path / "placement.json").read_text())
    assert placed["layout"].startswith("colocated on accelerators: 1 shared bundle(s)"), placed["layout"]
    assert placed["placement"]["colocated"] is True
    # the run's only placement group: one bundle holding the cluster's only device (each actor took half of
    # it: a second group or bundle could not have been granted)
    groups = list(placement_group_table().values())
    assert [g["bundles"] for g in groups] == [{0: {"fake_gpu": 1.0}}], groups
    assert placed["trainer_ranks"][0]["node_id"] == placed["engines"][0]["node_id"]
