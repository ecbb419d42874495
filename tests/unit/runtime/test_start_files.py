"""A Ray run has every model file its actors load before any actor starts: the actors run offline
(``HF_HUB_OFFLINE=1``), so the driver resolves the policy, its tokenizer and a separate critic's body at their
revisions first, downloading what its own environment allows, and a file it cannot have fails the run by its
config key with no actor spawned and its placement given back; on a cluster each node that cannot load a file
offline fails the start by name. No Ray here: ``build_ray_parts`` runs with its Ray-facing steps replaced by
spies that record the order of events, the hub cache is written by hand (``asyncrl.testing.hub_cache``), and a
"download" is a stand-in for ``huggingface_hub.snapshot_download`` that writes the repository into the cache."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import constants

from asyncrl import hub
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.hub import HubNotCachedError
from asyncrl.models import run_files
from asyncrl.models.loading import DEFAULT_MODEL_DIR, model_dir
from asyncrl.runtime import ray_runtime, start_files
from asyncrl.runtime.start_files import ModelFilesError
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_model

POLICY = "Qwen/Qwen3-8B-Base"
CRITIC = "someone/tiny-critic"


class Stop(Exception):
    """Ends a build at the step under test (nothing after it is faked)."""


def run_config(*extra: str, backend: str = "builtin") -> RunConfig:
    return load_run_config(
        None, ["runtime.type=local", f"model.path={POLICY}", f"engine.backend={backend}", *extra]
    )


@pytest.fixture(autouse=True)
def fresh_resolutions():
    """``asyncrl.hub`` remembers resolutions per process and cache: each test starts from none."""
    hub._snapshot.cache_clear()
    yield
    hub._snapshot.cache_clear()


@pytest.fixture
def events(monkeypatch) -> list[str]:
    """``build_ray_parts`` without Ray: every file the driver resolves, the reservation, each spawn and the
    engines' ready wait (with its deadline) are recorded in order; the wait ends the build."""
    recorded: list[str] = []
    resolve = run_files.resolve

    def spy_resolve(item, *, local_files_only):
        recorded.append(f"resolve {item.what}")
        return resolve(item, local_files_only=local_files_only)

    def spawn_trainer_ranks(config, placement, reservation, accelerator):
        recorded.append("spawn trainer ranks")
        for item in run_files.needed(config):  # what the ranks will load offline is in the cache by now
            assert run_files.resolve_here([vars(item)])[0]["ok"], item
        return []

    def spawn_run_engine(config, placement, reservation, index, name, asleep=0):
        recorded.append(f"spawn {name}")
        return SimpleNamespace(handle=f"handle-{name}", name=name)

    def wait_ready(engines, timeout_s):
        recorded.append(f"wait ready {timeout_s:g}")
        raise Stop

    reservation = SimpleNamespace(release=lambda: recorded.append("release"))
    monkeypatch.setattr(run_files, "resolve", spy_resolve)
    monkeypatch.setattr(ray_runtime.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray_runtime.ray, "kill", lambda handle, no_restart: recorded.append(f"kill {handle}"))
    monkeypatch.setattr(ray_runtime, "plan_placement", lambda *args, **kwargs: None)
    monkeypatch.setattr(ray_runtime, "role_bundles", lambda *args: [])
    monkeypatch.setattr(
        ray_runtime, "reserve", lambda roles, runtime: recorded.append("reserve") or reservation
    )
    monkeypatch.setattr(ray_runtime, "spawn_trainer_ranks", spawn_trainer_ranks)
    monkeypatch.setattr(ray_runtime, "spawn_run_engine", spawn_run_engine)
    monkeypatch.setattr(ray_runtime, "start_trainer_group", lambda *args: "group")
    monkeypatch.setattr(ray_runtime, "wait_ready", wait_ready)
    return recorded


def downloads_into_cache(monkeypatch, repos: dict[str, Path]) -> list[str]:
    """An online hub: ``snapshot_download`` fetches each of ``repos`` (id -> model directory) into the cache it
    is given, then reads it back as the real one does; returns the ids it downloaded."""
    import huggingface_hub

    real = huggingface_hub.snapshot_download
    fetched: list[str] = []

    def snapshot_download(repo_id, *, cache_dir, local_files_only, **kwargs):
        if not local_files_only and repo_id in repos:
            write_hub_model(cache_dir, repo_id, repos[repo_id])
            fetched.append(repo_id)
        return real(repo_id, cache_dir=cache_dir, local_files_only=True, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return fetched


def test_the_driver_downloads_the_model_before_any_actor_starts(tmp_path, monkeypatch, events):
    use_offline_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the driver may download; its actors may not
    fetched = downloads_into_cache(monkeypatch, {POLICY: DEFAULT_MODEL_DIR})
    config = run_config()
    with pytest.raises(Stop):
        ray_runtime.build_ray_parts(config, config.runtime)
    assert fetched == [POLICY]
    assert events[:4] == ["reserve", "resolve model.path", "resolve tokenizer", "spawn trainer ranks"]
    model_dir(config.model)  # offline, as an actor resolves it: the cache holds it


def test_a_model_missing_offline_fails_by_name_before_any_actor_is_spawned(tmp_path, monkeypatch, events):
    use_offline_cache(monkeypatch, tmp_path)  # an empty HF_HOME, HF_HUB_OFFLINE=1
    config = run_config(backend="vllm")
    with pytest.raises(
        HubNotCachedError, match=rf"model.path: model '{POLICY}' at revision 'main' is not in"
    ):
        ray_runtime.build_ray_parts(config, config.runtime)
    assert events == ["reserve", "resolve model.path", "release"]  # no actor; the placement given back


def test_a_separate_critic_is_resolved_at_its_own_revision_before_start(tmp_path, monkeypatch, events):
    cache = use_offline_cache(monkeypatch, tmp_path)
    write_hub_model(cache, POLICY, DEFAULT_MODEL_DIR)
    write_hub_model(cache, CRITIC, DEFAULT_MODEL_DIR, branch="v1")
    critic = ("advantage.name=gae", "critic.type=separate", f"critic.model_path={CRITIC}")
    config = run_config(*critic, "critic.revision=v1")
    with pytest.raises(Stop):
        ray_runtime.build_ray_parts(config, config.runtime)
    assert events[:5] == [
        "reserve",
        "resolve model.path",
        "resolve tokenizer",
        "resolve critic.model_path",
        "spawn trainer ranks",
    ]

    events.clear()
    config = run_config(*critic, "critic.revision=v9")  # a revision the offline cache does not hold
    with pytest.raises(HubNotCachedError, match=rf"critic.model_path: model '{CRITIC}' at revision 'v9'"):
        ray_runtime.build_ray_parts(config, config.runtime)
    assert not any(e.startswith("spawn") for e in events) and events[-1] == "release"


def test_a_vllm_engine_gets_at_least_its_own_startup_deadline(tmp_path, monkeypatch, events):
    cache = use_offline_cache(monkeypatch, tmp_path)
    write_hub_model(cache, POLICY, DEFAULT_MODEL_DIR)
    runtime_s = "runtime.startup_timeout_s=300"
    for backend, vllm_s, waited in (("builtin", 900, 300), ("vllm", 900, 960), ("vllm", 10, 300)):
        events.clear()
        config = run_config(runtime_s, f"engine.vllm.startup_timeout_s={vllm_s}", backend=backend)
        assert ray_runtime.engine_start_timeout_s(config) == waited
        with pytest.raises(Stop):
            ray_runtime.build_ray_parts(config, config.runtime)
        assert f"wait ready {waited}" in events
        assert events[-2:] == ["kill handle-engine-0", "release"]  # a failed start ends what it spawned


def test_a_cluster_node_that_cannot_load_a_file_offline_fails_the_start_by_name(
    tmp_path, monkeypatch, events
):
    driver = use_offline_cache(monkeypatch, tmp_path / "driver")
    node_cache = tmp_path / "node" / "hub"
    write_hub_model(node_cache, POLICY, DEFAULT_MODEL_DIR, commit="b" * 40)  # another commit only
    asked: list[str] = []

    def each_node(accelerator, fn, args, deadline_s):
        asked.append(accelerator)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(node_cache))  # as that node's worker sees it
        try:
            return [
                {"node": "10.0.0.2 (node bbbb)", "answer": fn(*args)},
                {"node": "10.0.0.3 (node cccc)", "error": "no answer in 120 s"},
            ]
        finally:
            monkeypatch.setattr(constants, "HF_HUB_CACHE", str(driver))

    monkeypatch.setattr(start_files, "each_node", each_node)
    pinned = "a" * 40
    write_hub_model(driver, POLICY, DEFAULT_MODEL_DIR, commit=pinned)
    config = load_run_config(
        None,
        [
            "runtime.type=cluster",
            "runtime.address=ray://head:10001",
            "model.device=cuda",
            f"model.path={POLICY}",
            f"model.revision={pinned}",
        ],
    )
    with pytest.raises(ModelFilesError) as error:
        ray_runtime.build_ray_parts(config, config.runtime)
    assert asked == ["GPU"]  # the nodes the actors can be placed on
    message = str(error.value)
    assert f"node 10.0.0.2 (node bbbb): model.path '{POLICY}' at revision '{pinned}'" in message
    assert f"node 10.0.0.2 (node bbbb): tokenizer '{POLICY}'" in message
    assert "node 10.0.0.3 (node cccc): the check did not run there: no answer in 120 s" in message
    assert events[:3] == [
        "reserve",
        "resolve model.path",
        "resolve tokenizer",
    ]  # the driver's, then the node's
    assert not any(e.startswith("spawn") for e in events) and events[-1] == "release"
