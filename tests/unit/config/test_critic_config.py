"""The critic and GAE settings: defaults, what applies where, and the errors that name the key."""

import pytest

from asyncrl.config.algorithm import AdvantageConfig
from asyncrl.config.base import ConfigError
from asyncrl.config.critic import CriticConfig
from asyncrl.config.run import load_run_config


def test_gae_fills_its_defaults_and_a_critic_section():
    config = load_run_config(None, ["advantage.name=gae", "critic.type=shared_trunk"])
    assert (config.advantage.gamma, config.advantage.lam, config.advantage.whiten) == (1.0, 0.95, True)
    assert config.critic == CriticConfig(type="shared_trunk")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["advantage.name=gae"], "advantage.name='gae' needs a critic section"),
        (["critic.type=separate"], "critic is set but advantage.name is 'grpo'"),
        (["advantage.lam=0.9"], "advantage.lam applies only to advantage.name='gae'"),
        (
            ["advantage.name=gae", "critic.type=value"],
            "critic.type must be one of 'separate', 'shared_trunk'",
        ),
        (
            ["advantage.name=gae", "advantage.gamma=1.5", "critic.type=separate"],
            r"advantage.gamma must be in \[0, 1\]",
        ),
        (
            ["advantage.name=gae", "critic.type=shared_trunk", "critic.model_path=x"],
            "critic.model_path applies only to critic.type='separate'",
        ),
        (
            ["advantage.name=gae", "critic.type=separate", "critic.revision=v1"],
            r"critic.revision \('v1'\) applies only with critic.model_path",
        ),
        (["advantage.name=gae", "critic.warmup_steps=-1"], "critic.warmup_steps must be >= 0"),
        (["advantage.name=gae", "critic.value_clip=0"], "critic.value_clip must be > 0 or null"),
    ],
)
def test_bad_critic_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, overrides)


def test_gae_takes_eps_for_whitening():
    assert AdvantageConfig(name="gae", eps=1e-3).eps == 1e-3
