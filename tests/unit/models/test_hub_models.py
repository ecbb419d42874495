"""Hub ids load through ``huggingface_hub`` from a hub-layout cache the test writes, with no network: the revision
is honoured, ``HF_HUB_OFFLINE`` / ``local_files_only`` never download, and a missing model is a named error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from asyncrl.config.model import ModelConfig
from asyncrl.hub import HubNotCachedError, is_hub_id
from asyncrl.models.loading import (
    DEFAULT_MODEL_DIR,
    load_configured_model,
    load_model_and_tokenizer,
    model_dir,
    resolve_model_path,
)
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_model, write_hub_repo

REPO = "asyncrl-test/tiny-copy"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache (and datasets cache) this process uses, offline as ``HF_HUB_OFFLINE=1`` makes it."""
    return use_offline_cache(monkeypatch, tmp_path)


def test_a_hub_id_loads_from_the_cache_at_the_branch_and_at_a_pinned_commit(hub_cache: Path) -> None:
    first = write_hub_model(hub_cache, REPO, DEFAULT_MODEL_DIR)
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    changed = {**config, "asyncrl_marker": "second"}
    files = {p.name: p.read_bytes() for p in DEFAULT_MODEL_DIR.iterdir() if p.is_file()}
    second = write_hub_repo(hub_cache, REPO, {**files, "config.json": json.dumps(changed).encode()})
    assert first != second
    latest = resolve_model_path(REPO)  # main now points at the second commit
    assert latest == hub_cache / "models--asyncrl-test--tiny-copy" / "snapshots" / second
    pinned = resolve_model_path(REPO, first)
    assert pinned.name == first and "asyncrl_marker" not in (pinned / "config.json").read_text()
    model, tokenizer = load_model_and_tokenizer(REPO, device="cpu", revision=first)
    reference, reference_tokenizer = load_model_and_tokenizer("", device="cpu")
    assert tokenizer.encode("copy a b:") == reference_tokenizer.encode("copy a b:")
    assert all(
        (a == b).all()
        for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True)
    )


def test_a_model_missing_offline_names_the_id_revision_and_cache(hub_cache: Path) -> None:
    with pytest.raises(HubNotCachedError, match=r"'nobody/absent' at revision 'main' is not in") as error:
        load_configured_model(ModelConfig(path="nobody/absent", device="cpu"))
    assert str(hub_cache) in str(error.value) and "HF_HUB_OFFLINE" in str(error.value)
    write_hub_model(hub_cache, REPO, DEFAULT_MODEL_DIR)
    with pytest.raises(HubNotCachedError, match=r"revision 'v9'"):
        model_dir(ModelConfig(path=REPO, revision="v9"))


def test_local_files_only_never_downloads_even_when_online(hub_cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(HubNotCachedError, match="downloads are off"):
        model_dir(ModelConfig(path="nobody/elsewhere", local_files_only=True))
    write_hub_model(hub_cache, REPO, DEFAULT_MODEL_DIR)
    assert (model_dir(ModelConfig(path=REPO, local_files_only=True)) / "config.json").is_file()


def test_local_directories_and_shipped_names_keep_working_and_refuse_a_revision(tmp_path: Path) -> None:
    assert resolve_model_path("tiny-count").name == "tiny-count"
    assert resolve_model_path(str(DEFAULT_MODEL_DIR)) == DEFAULT_MODEL_DIR
    with pytest.raises(ValueError, match="model.revision"):
        resolve_model_path("tiny-count", "abc123")
    with pytest.raises(FileNotFoundError, match="not a hub id"):
        resolve_model_path(str(tmp_path / "nothing" / "here"))
    assert is_hub_id("Qwen/Qwen3-1.7B") and is_hub_id("gpt2")
    assert not any(is_hub_id(p) for p in ("./model", "/abs/model", "a/b/c", "~/m", ""))


def test_the_cli_honours_hf_home_and_hf_hub_offline(tmp_path: Path) -> None:
    """What a user does: HF_HOME at a cache, HF_HUB_OFFLINE=1, a hub id on the command line."""
    write_hub_model(tmp_path / "home" / "hub", REPO, DEFAULT_MODEL_DIR)
    env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    command = [sys.executable, "-m", "asyncrl.cli.main", "generate", REPO, "--prompt", "copy a b:"]
    done = subprocess.run(
        [*command, "--max-new-tokens", "6", "--temperature", "0", "--json", "--device", "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completion"].split()[:2] == ["a", "b"]
    missing = subprocess.run(
        [*command[:4], "nobody/absent", "--prompt", "x"], env=env, capture_output=True, text=True, timeout=120
    )
    assert missing.returncode != 0
    assert "'nobody/absent'" in missing.stderr and str(tmp_path / "home" / "hub") in missing.stderr
