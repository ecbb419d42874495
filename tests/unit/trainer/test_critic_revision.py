"""A separate critic's body (``critic.model_path``) is resolved at ``critic.revision``, its own repository's, never
at the policy's ``model.revision``: a folder critic loads beside a pinned policy, a hub critic loads at its own
commit (or its ``main``) while the policy is pinned to a commit the critic's repository does not have, and the
errors name the critic's keys. The hub is a hand-written offline cache (``asyncrl.testing.hub_cache``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.hub import HubNotCachedError
from asyncrl.models.loading import DEFAULT_MODEL_DIR, load_configured_model
from asyncrl.models.tiny import build_tiny_model
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_model
from asyncrl.trainer.factory import build_trainer
from asyncrl.trainer.trainer import Trainer

POLICY = "org/policy"
CRITIC = "org/critic"
PINNED_CRITIC = {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "num_layers": 1, "seed": 3}
MAIN_CRITIC = {"hidden_size": 96, "num_heads": 4, "num_kv_heads": 2, "num_layers": 1, "seed": 4}
"""Two commits of the critic's repository, told apart by their width."""


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """An offline cache holding the policy at one commit, and the critic at two others (``main`` at the second);
    returns (the policy's commit, the critic's first commit)."""
    cache = use_offline_cache(monkeypatch, tmp_path / "home")
    policy_commit = write_hub_model(cache, POLICY, DEFAULT_MODEL_DIR)
    commits = []
    for name, shape in (("pinned", PINNED_CRITIC), ("main", MAIN_CRITIC)):
        build_tiny_model(**shape).save_pretrained(tmp_path / name)
        commits.append(write_hub_model(cache, CRITIC, tmp_path / name))
    assert policy_commit not in commits
    return policy_commit, commits[0]


def critic_config(policy_revision: str, critic_path: str, *critic_revision: str) -> RunConfig:
    return load_run_config(
        None,
        [
            f"model.path={POLICY}",
            f"model.revision={policy_revision}",
            "model.device=cpu",
            "loss.name=ppo",
            "advantage.name=gae",
            "critic.type=separate",
            f"critic.model_path={critic_path}",
            *(f"critic.revision={r}" for r in critic_revision),
        ],
    )


def build(config: RunConfig) -> Trainer:
    model, tokenizer = load_configured_model(config.model)
    return build_trainer(config, model.train(), tokenizer)


def critic_width(trainer: Trainer) -> int:
    assert trainer.critic is not None and not trainer.critic.shared
    return trainer.critic.module.body.config.hidden_size


def test_a_critic_folder_loads_beside_a_pinned_policy(hub, tmp_path) -> None:
    policy_commit, _ = hub
    folder = tmp_path / "pinned"  # the first critic commit's files, as a plain folder
    assert critic_width(build(critic_config(policy_commit, str(folder)))) == PINNED_CRITIC["hidden_size"]


def test_a_hub_critic_loads_at_its_own_revision_not_the_policys(hub) -> None:
    policy_commit, critic_commit = hub
    default = build(critic_config(policy_commit, CRITIC))  # empty: the critic repository's main
    assert critic_width(default) == MAIN_CRITIC["hidden_size"]
    pinned = build(critic_config(policy_commit, CRITIC, critic_commit))
    assert critic_width(pinned) == PINNED_CRITIC["hidden_size"]


def test_a_revision_beside_a_folder_and_a_missing_commit_name_the_critics_keys(hub, tmp_path) -> None:
    policy_commit, critic_commit = hub
    with pytest.raises(ValueError, match=r"critic.revision \('abc'\) applies to hub ids"):
        build(critic_config(policy_commit, str(tmp_path / "pinned"), "abc"))
    with pytest.raises(HubNotCachedError, match=rf"critic.model_path: model '{CRITIC}' at revision 'v9'"):
        build(critic_config(policy_commit, CRITIC, "v9"))
