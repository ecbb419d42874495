"""RunConfig's producer switch: agentic sections are filled only for producer 'agentic', and a setting the
chosen producer would not read is an error naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.app.wiring import make_buffer
from asyncrl.config.base import ConfigError, from_dict
from asyncrl.config.env import EnvConfig, EnvManagerConfig
from asyncrl.config.loader import parse_yaml, to_yaml
from asyncrl.config.run import RunConfig, load_run_config

EXAMPLE = Path(__file__).resolve().parents[3] / "asyncrl" / "examples" / "agentic.yaml"


def test_rlvr_leaves_the_agentic_sections_empty():
    cfg = load_run_config(None, [])
    assert cfg.producer == "rlvr"
    assert cfg.env is None and cfg.env_manager is None


def test_agentic_fills_its_sections_with_defaults_and_overrides():
    cfg = load_run_config(None, ["producer=agentic", "env.num_turns=2", "env_manager.stepping=batch"])
    assert cfg.env == EnvConfig(num_turns=2)
    assert cfg.env_manager == EnvManagerConfig(stepping="batch")


def test_agentic_config_round_trips_through_yaml():
    cfg = load_run_config(None, ["producer=agentic", "env.max_span=6"])
    assert from_dict(RunConfig, parse_yaml(to_yaml(cfg))) == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.num_turns=2"], "env is set but producer is 'rlvr'; it applies only to producer 'agentic'"),
        (
            ["env_manager.group_size=4"],
            "env_manager is set but producer is 'rlvr'; it applies only to producer 'agentic'",
        ),
        (["producer=tool"], "producer must be one of 'rlvr', 'agentic'"),
        (
            ["producer=agentic", "task.num_train=10"],
            "task is set but producer is 'agentic', which does not read it: episodes come from the env section",
        ),
        (
            ["producer=agentic", "reward.name=x:y"],
            "reward is set but producer is 'agentic', which does not read it",
        ),
        (
            ["producer=agentic", "rollout.max_additional_running_prompts=2"],
            "rollout.max_additional_running_prompts is set but producer is 'agentic', which does not read it: "
            "redundant env groups are env_manager.num_env_groups beyond rollout.rollout_batch_size",
        ),
        (
            ["producer=agentic", "rollout.generation=batch"],
            "rollout.generation is set but producer is 'agentic', which does not read it: "
            "env_manager.stepping chooses async or batch",
        ),
        (
            ["producer=agentic", "rollout.prompt_replication=false"],
            "rollout.prompt_replication is set but producer is 'agentic'",
        ),
        (
            ["producer=agentic", "rollout.num_return_sequences=9"],
            "env_manager.group_size=8 must be >= rollout.num_return_sequences=9",
        ),
        (
            ["producer=agentic", "rollout.rollout_batch_size=9"],
            "env_manager.num_env_groups=8 must be >= rollout.rollout_batch_size=9",
        ),
        (
            ["producer=agentic", "engine.max_model_len=256"],
            "env_manager.max_context_tokens=4096 must be <= engine.max_model_len=256: a whole episode context "
            "must fit one engine request",
        ),
        (
            ["producer=agentic", "engine.max_kv_tokens=1000"],
            "env_manager.max_context_tokens=4096 must be <= engine.max_kv_tokens=1000",
        ),
    ],
)
def test_settings_the_producer_would_ignore_are_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_run_config(None, overrides)
    assert message in str(info.value)


def test_setting_an_rlvr_key_to_its_default_is_harmless():
    cfg = load_run_config(None, ["producer=agentic", "rollout.max_additional_running_prompts=0"])
    assert cfg.rollout.max_additional_running_prompts == 0


def test_the_shipped_example_loads_and_has_one_redundant_env_group():
    cfg = load_run_config(EXAMPLE, [])
    assert cfg.producer == "agentic" and cfg.controller.mode == "async"
    assert cfg.env == EnvConfig(type="copy_chain", num_turns=2, median_items=2, length_sigma=0.5, max_items=4)
    buffer = make_buffer(cfg.buffer, cfg.rollout, producer=cfg.producer, env_manager=cfg.env_manager)
    assert buffer.max_redundant_groups == cfg.env_manager.num_env_groups - cfg.rollout.rollout_batch_size == 1


def test_rlvr_buffer_keeps_the_redundant_prompts():
    cfg = load_run_config(None, ["rollout.max_additional_running_prompts=3"])
    buffer = make_buffer(
        cfg.buffer, cfg.rollout, producer=cfg.producer, env_manager=cfg.env_manager, trainer_version=2
    )
    assert buffer.max_redundant_groups == 3
