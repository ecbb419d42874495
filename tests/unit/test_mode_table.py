"""The ModeSpec table is the one description of the paradigms: configs, sweeps and docs all agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.cli.simulate import swept
from asyncrl.config.base import ConfigError
from asyncrl.config.loader import from_dict
from asyncrl.config.run import RunConfig
from asyncrl.config.sim import SimConfig
from asyncrl.modes import (
    MODE_SPECS,
    MODES,
    ModeError,
    async_ratio_for,
    check_mode,
    mode_spec,
    modes_table_markdown,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "modes.md"


def test_docs_table_is_rendered_from_the_specs():
    assert modes_table_markdown() in DOCS.read_text()


def test_each_mode_fixes_what_the_docs_say():
    assert MODES == ("sync", "one_step_off", "async", "partial_rollout", "multi_version")
    assert [MODE_SPECS[m].fixed_async_ratio for m in MODES] == [0.0, 1.0, None, None, None]
    assert [MODE_SPECS[m].update_policy for m in MODES] == [
        "drain",
        "drain",
        "drain",
        "in_flight",
        "multi_version",
    ]
    assert [m for m in MODES if MODE_SPECS[m].partial_rollouts] == ["partial_rollout"]
    assert [m for m in MODES if MODE_SPECS[m].multi_version] == ["multi_version"]


@pytest.mark.parametrize("config_class", [RunConfig, SimConfig])
def test_sync_with_a_positive_ratio_is_the_same_error_for_a_real_and_a_simulated_run(config_class):
    data = {"controller": {"mode": "sync"}, "buffer": {"async_ratio": 2.0}}
    with pytest.raises(
        ConfigError, match=r"controller.mode='sync' needs buffer.async_ratio=0, got 2"
    ) as error:
        from_dict(config_class, data)
    assert isinstance(error.value.__cause__, ModeError)


@pytest.mark.parametrize("config_class", [RunConfig, SimConfig])
def test_update_policy_contradicting_the_mode_is_the_same_error(config_class):
    data = {"controller": {"mode": "partial_rollout"}, "proxy": {"update_policy": "drain"}}
    with pytest.raises(
        ConfigError, match=r"needs proxy.update_policy='in_flight' \(or null\), got 'drain'"
    ) as error:
        from_dict(config_class, data)
    assert isinstance(error.value.__cause__, ModeError)


def test_unknown_mode_names_the_allowed_ones():
    with pytest.raises(ModeError, match="controller.mode must be one of 'sync', 'one_step_off'"):
        mode_spec("lockstep")


def test_legal_combinations_pass():
    check_mode("one_step_off", async_ratio=1.0, update_policy=None)
    check_mode("async", async_ratio=7.5, update_policy="drain")
    check_mode("multi_version", async_ratio=0.0, update_policy="multi_version")


def test_async_ratio_for_takes_the_fixed_ratio_of_modes_that_fix_it():
    assert [async_ratio_for(m, 2.0) for m in MODES] == [0.0, 1.0, 2.0, 2.0, 2.0]


def test_a_mode_sweep_brings_the_fixed_ratio_along():
    assert swept("controller.mode", "sync") == ["controller.mode=sync", "buffer.async_ratio=0"]
    assert swept("controller.mode", "one_step_off") == [
        "controller.mode=one_step_off",
        "buffer.async_ratio=1",
    ]
    assert swept("controller.mode", "async") == ["controller.mode=async"]
    assert swept("buffer.async_ratio", "2") == ["buffer.async_ratio=2"]
