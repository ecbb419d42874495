"""Named off-policy presets: what each sets, how keys beside it win, and the docs table kept in step."""

from pathlib import Path

import pytest

from asyncrl.config.algorithm import PRESETS, LossConfig, MismatchConfig, preset_keys
from asyncrl.config.base import ConfigError, from_dict, to_dict
from asyncrl.config.run import RunConfig, load_run_config

DOCS = Path(__file__).resolve().parents[3] / "docs" / "algorithms.md"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_loads_to_the_keys_it_names(name):
    by_preset = load_run_config(None, [f"loss.preset={name}"]).loss
    by_keys = load_run_config(None, preset_keys(name)).loss
    assert by_preset == LossConfig(**{**_fields(by_keys), "preset": name})
    assert LossConfig(preset=name) == by_preset  # built in Python, the preset fills the same sections


def _fields(config: LossConfig) -> dict:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def test_keys_beside_a_preset_win_key_by_key():
    loss = load_run_config(None, ["loss.preset=geo_rs", "loss.mismatch.high=1.002"]).loss
    assert loss.mismatch == MismatchConfig(granularity="geometric", mode="reject", low=0.999, high=1.002)


def test_presets_set_what_their_papers_describe():
    assert LossConfig(preset="m2po").name == "tis" and LossConfig(preset="m2po").params.cap is None
    assert LossConfig(preset="m2po").m2po.threshold == 0.04
    assert LossConfig(preset="opsm").opsm.delta == 1e-4
    assert LossConfig(preset="k3_rs").k3_rejection.threshold == 0.01
    assert LossConfig(preset="decoupled_ppo").needs_proximal_forward
    assert LossConfig(preset="icepop").mismatch == MismatchConfig(mode="mask", low=0.5, high=5.0)


def test_an_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match="loss.preset must be one of .*'icepop'"):
        load_run_config(None, ["loss.preset=ice_pop"])


def test_a_preset_config_round_trips():
    config = load_run_config(None, ["loss.preset=m2po"])
    assert from_dict(RunConfig, to_dict(config)) == config


def test_loglinear_proximal_is_refused_with_step_start_masks():
    with pytest.raises(ConfigError, match="loglinear"):
        load_run_config(
            None, ["loss.preset=k3_rs", "loss.name=decoupled_ppo", "loss.decoupled_ppo.proximal=loglinear"]
        )


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_docs_table_lists_each_preset_with_its_keys(name):
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"docs/algorithms.md needs exactly one preset row for {name}"
    keys_cell = rows[0].split("|")[2]
    assert sorted(k.strip(" `") for k in keys_cell.split(",")) == sorted(preset_keys(name))
