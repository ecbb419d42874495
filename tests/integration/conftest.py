"""Fixtures the integration tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import save_tiny
from asyncrl.models.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    """A tiny random model and its tokenizer saved as a model directory (the real loading code reads it)."""
    model, tokenizer = build_tiny(
        sample_texts(200),
        vocab_size=300,
        hidden_size=64,
        num_heads=2,
        num_layers=2,
        max_position_embeddings=256,
    )
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def one_gpu_cluster():
    """A one-node Ray cluster (2 CPUs) whose one stand-in GPU is the custom resource ``fake_gpu``: what a
    trainer rank and an engine sharing one bundle are placed on (``runtime.accelerator_resource=fake_gpu``)."""
    yield from fake_gpu_cluster(1)


@pytest.fixture(scope="module")
def two_gpu_cluster():
    """``one_gpu_cluster`` with two stand-in GPUs: two (trainer rank, engine) pairs, one per shared bundle."""
    yield from fake_gpu_cluster(2)


def fake_gpu_cluster(gpus: int):
    import ray  # here: the suite's other tests need no Ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"fake_gpu": gpus}})
    ray.init(address=nodes.address)
    nodes.wait_for_nodes()
    yield nodes
    ray.shutdown()
    nodes.shutdown()
