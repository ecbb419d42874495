"""``asyncrl doctor``'s real cluster probe on two Ray nodes on one machine (``ray.cluster_utils.Cluster``), each
raylet with a Hugging Face cache of its own: the node whose cache holds the hub model passes, the other is named
with the cache it looked in, for the model and its tokenizer alike. The unit tests play the nodes with a fake
runner; this one runs the probe process, its pinned tasks and the actors' environment for real."""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from asyncrl.app.doctor import Status, check_ray
from asyncrl.config.run import load_run_config
from asyncrl.models.loading import DEFAULT_MODEL_DIR
from asyncrl.testing.hub_cache import write_hub_model

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # two raylets and a probe process: tens of seconds

REPO = "someone/tiny"


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory):
    """A head node whose cache holds ``REPO`` and a second node whose cache is empty, one stand-in GPU each."""
    if ray.is_initialized():
        ray.shutdown()
    filled, empty = tmp_path_factory.mktemp("filled"), tmp_path_factory.mktemp("empty")
    write_hub_model(filled, REPO, DEFAULT_MODEL_DIR)
    nodes = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"fake_gpu": 1},
            "env_vars": {"HF_HUB_CACHE": str(filled)},
        },
    )
    nodes.add_node(num_cpus=1, resources={"fake_gpu": 1}, env_vars={"HF_HUB_CACHE": str(empty)})
    nodes.wait_for_nodes()
    yield nodes, empty
    nodes.shutdown()


def test_the_node_without_the_model_in_its_cache_is_named(two_caches) -> None:
    nodes, empty = two_caches
    config = load_run_config(
        None,
        [
            "runtime.type=cluster",
            f"runtime.address={nodes.address}",
            "runtime.accelerator_resource=fake_gpu",
            "model.device=cuda",  # the run reserves the stand-in GPUs: 1 trainer rank + 1 engine
            f"model.path={REPO}",
        ],
    )
    ray_finding, *files = check_ray(config)
    assert ray_finding.status is Status.OK, ray_finding.line()
    assert [f.status for f in files] == [Status.FAIL, Status.FAIL], "\n".join(f.line() for f in files)
    assert [f.detail.split(": ")[1].split(" ")[0] for f in files] == ["model.path", "tokenizer"]
    node = files[0].detail.split(": ")[0]
    assert all(f.detail.startswith(node) and str(empty) in f.detail for f in files)  # one node, its cache


def test_a_run_on_that_cluster_fails_at_start_naming_the_node_before_any_actor(
    two_caches, tmp_path, monkeypatch
) -> None:
    """The run makes doctor's check itself once its placement is granted: the driver holds the model, one node
    does not, and the start fails naming that node and its cache, with no trainer rank or engine spawned."""
    from asyncrl.runtime import ray_runtime
    from asyncrl.runtime.start_files import ModelFilesError
    from asyncrl.testing.hub_cache import use_offline_cache

    nodes, empty = two_caches
    write_hub_model(use_offline_cache(monkeypatch, tmp_path), REPO, DEFAULT_MODEL_DIR)  # the driver's cache
    spawned: list[int] = []
    monkeypatch.setattr(ray_runtime, "spawn_trainer_ranks", lambda *args: spawned.append(1) or [])
    config = load_run_config(
        None,
        [
            "runtime.type=cluster",
            f"runtime.address={nodes.address}",
            "runtime.accelerator_resource=fake_gpu",
            "runtime.train_num_cpus=0.5",
            "runtime.rollout_num_cpus=0.5",
            "model.device=cuda",
            f"model.path={REPO}",
        ],
    )
    with ray_runtime.ray_session(config.runtime), pytest.raises(ModelFilesError) as error:
        ray_runtime.build_ray_parts(config, config.runtime)
    failing = [line for line in str(error.value).splitlines() if line.startswith("  node ")]
    assert [line.split(": ")[1] for line in failing] == [f"model.path {REPO!r}", f"tokenizer {REPO!r}"]
    assert len({line.split(": ")[0] for line in failing}) == 1  # one node: the one with the empty cache
    assert all(str(empty) in line for line in failing)
    assert spawned == []
