"""``asyncrl doctor`` on a Ray cluster asks every node whether the run's model files load there offline, as its
actors load them (``HF_HUB_OFFLINE=1``). No cluster here: the probe process is a fake runner that plays two
nodes by running the real node-side check (``cluster_probe.resolve_here``) once per node against that node's
own hub cache."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from huggingface_hub import constants

from asyncrl.app import cluster_probe
from asyncrl.app.doctor import Status, check_ray
from asyncrl.config.run import load_run_config
from asyncrl.models.loading import DEFAULT_MODEL_DIR
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_model

REPO = "someone/tiny"


def cluster_config(revision: str, *extra: str):
    return load_run_config(
        None,
        [
            "runtime.type=cluster",
            "runtime.address=ray://head:10001",
            "model.device=cuda",
            f"model.path={REPO}",
            "rollout.num_engines=2",
            *([f"model.revision={revision}"] if revision else []),
            *extra,
        ],
    )


def nodes_with_caches(caches: dict[str, Path], monkeypatch, calls: list[dict]):
    """A runner standing in for the probe process: each named node answers ``resolve_here`` with its own hub
    cache, as ``runtime.node_probe.on_each_node`` reports it."""

    def run(command, timeout_s):
        args = json.loads(command[-1])
        calls.append(args)
        nodes = []
        for name, cache in caches.items():
            monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
            nodes.append({"node": name, "answer": cluster_probe.resolve_here(args["items"])})
        report = {"resources": {"CPU": 32, "GPU": 16}, "nodes": nodes}
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(report), stderr="")

    return run


@pytest.fixture
def caches(tmp_path, monkeypatch) -> tuple[dict[str, Path], str]:
    """Node A's cache holds the model at the pinned commit; node B's holds another commit of it only."""
    use_offline_cache(monkeypatch, tmp_path / "driver")
    node_a, node_b = tmp_path / "a" / "hub", tmp_path / "b" / "hub"
    pinned = write_hub_model(node_a, REPO, DEFAULT_MODEL_DIR)
    write_hub_model(node_b, REPO, DEFAULT_MODEL_DIR, commit="b" * 40)
    return {"10.0.0.1 (node aaaa)": node_a, "10.0.0.2 (node bbbb)": node_b}, pinned


def test_a_node_whose_cache_lacks_the_pinned_revision_fails_by_name(caches, monkeypatch) -> None:
    nodes, pinned = caches
    calls: list[dict] = []
    findings = check_ray(cluster_config(pinned), run=nodes_with_caches(nodes, monkeypatch, calls))
    assert calls[0]["accelerator"] == "GPU"  # only the nodes the run's actors can be placed on
    assert [i["what"] for i in calls[0]["items"]] == ["model.path", "tokenizer"]
    ray, *files = findings
    assert ray.status is Status.OK
    assert [f.status for f in files] == [Status.FAIL, Status.FAIL]  # the model and its tokenizer
    for finding in files:
        assert finding.topic == "model files" and finding.detail.startswith("node 10.0.0.2 (node bbbb): ")
        assert f"{REPO!r} at revision {pinned!r} does not load offline there" in finding.detail
        assert str(nodes["10.0.0.2 (node bbbb)"]) in finding.detail  # the cache it looked in
        assert "hf download" in finding.fix


def test_every_node_holding_the_files_is_one_ok(caches, monkeypatch, tmp_path) -> None:
    nodes, _ = caches
    critic = tmp_path / "critic"
    critic.mkdir()
    (critic / "config.json").write_text((DEFAULT_MODEL_DIR / "config.json").read_text())
    both = {name: nodes["10.0.0.1 (node aaaa)"] for name in ("10.0.0.1 (node aaaa)", "10.0.0.3 (node cccc)")}
    extra = ("advantage.name=gae", "critic.type=separate", f"critic.model_path={critic}")
    calls: list[dict] = []
    ray, files = check_ray(cluster_config("", *extra), run=nodes_with_caches(both, monkeypatch, calls))
    assert (ray.status, files.status, files.topic) == (Status.OK, Status.OK, "model files")
    assert "on each of the 2 node(s)" in files.detail and f"critic.model_path {str(critic)!r}" in files.detail
    assert [i["what"] for i in calls[0]["items"]] == ["model.path", "tokenizer", "critic.model_path"]


def test_a_model_folder_missing_on_a_node_and_a_node_that_did_not_answer_fail(tmp_path) -> None:
    [answer] = cluster_probe.resolve_here(
        [{"what": "critic.model_path", "path": str(tmp_path / "absent"), "revision": ""}]
    )
    assert not answer["ok"] and str(tmp_path / "absent") in answer["error"]
    config = cluster_config("", "model.device=cpu")
    report = {
        "resources": {"CPU": 8},
        "nodes": [
            {"node": "10.0.0.1 (node aaaa)", "answer": [answer]},
            {"node": "10.0.0.2 (node bbbb)", "error": "no answer in 120 s"},
        ],
    }

    def run(command, timeout_s):
        assert json.loads(command[-1])["accelerator"] == ""  # a CPU run may be placed on any node
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(report), stderr="")

    ray, folder, silent = check_ray(config, run=run)
    assert ray.status is Status.OK and folder.status is silent.status is Status.FAIL
    assert f"node 10.0.0.1 (node aaaa): critic.model_path {str(tmp_path / 'absent')!r}" in folder.detail
    assert "node 10.0.0.2 (node bbbb): the check did not run there: no answer in 120 s" in silent.detail


def test_a_hub_critic_is_probed_at_its_own_revision(caches, monkeypatch, tmp_path) -> None:
    """The policy is pinned to a commit the critic's repository does not have; the critic resolves at
    ``critic.revision`` on each node, and a node lacking that commit fails naming the critic's keys."""
    nodes, pinned = caches
    critic = "someone/critic"
    own = write_hub_model(nodes["10.0.0.1 (node aaaa)"], critic, DEFAULT_MODEL_DIR, commit="c" * 40)
    write_hub_model(nodes["10.0.0.2 (node bbbb)"], critic, DEFAULT_MODEL_DIR, commit="d" * 40)
    extra = ("advantage.name=gae", "critic.type=separate", f"critic.model_path={critic}")
    node_a = {"10.0.0.1 (node aaaa)": nodes["10.0.0.1 (node aaaa)"]}
    calls: list[dict] = []
    config = cluster_config(pinned, *extra, f"critic.revision={own}")
    ray, files = check_ray(config, run=nodes_with_caches(node_a, monkeypatch, calls))
    assert files.status is Status.OK and f"critic.model_path {critic!r}" in files.detail
    assert calls[0]["items"][2] == {"what": "critic.model_path", "path": critic, "revision": own}
    ray, *failures = check_ray(config, run=nodes_with_caches(nodes, monkeypatch, []))
    assert len(failures) == 3
    # node B lacks the pinned policy (model and tokenizer) and the critic's commit: the critic's FAIL names its keys
    [missing] = [f for f in failures if "critic.model_path" in f.detail]
    assert missing.detail.startswith("node 10.0.0.2 (node bbbb): critic.model_path ")
    offline = (
        f"{critic!r} at revision {own!r} does not load offline there: HubNotCachedError: critic.model_path:"
    )
    assert offline in missing.detail
    [folder] = cluster_probe.resolve_here(
        [{"what": "critic.model_path", "path": str(DEFAULT_MODEL_DIR), "revision": own}]
    )
    assert not folder["ok"] and folder["error"].startswith(
        f"ValueError: critic.revision ({own!r}) applies to"
    )


@pytest.mark.parametrize("runtime", ["inline", "local"])
def test_a_run_on_one_machine_probes_no_cluster(runtime) -> None:
    def no_probe(command, timeout_s):
        raise AssertionError("a one-machine run has no cluster to probe")

    [finding] = check_ray(load_run_config(None, [f"runtime.type={runtime}"]), run=no_probe)
    assert finding.topic == "ray" and finding.status is Status.OK
