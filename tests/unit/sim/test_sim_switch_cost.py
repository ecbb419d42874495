"""The colocated switch's cost term: bytes moved over the host link and the device, over the profile's
bandwidths, plus a fixed part; checked by hand for Qwen3-8B on a round-number card."""

from __future__ import annotations

import pytest
from test_sim_derive import CARD, _config

from asyncrl.config.base import ConfigError
from asyncrl.sim.derive import colocated_switch_parts, load_sim_config
from asyncrl.sim.hardware import write_profile
from asyncrl.sim.model_shape import NAMED_SHAPES

PARAMS = 8_190_427_136
HOST = 25e9  # the profile's default host link
HBM = 4e12 * 0.5  # HBM bandwidth at the card's memory-bound efficiency
COLOCATED = ("trainer.colocated=true", "rollout.num_engines=4")


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """The card's profile file where ``_config`` looks for it (``hardware=card.json``)."""
    monkeypatch.chdir(tmp_path)
    write_profile(CARD, tmp_path / "card.json")


def parts(*extra: str) -> dict[str, float]:
    config = _config("qwen3-8b", *COLOCATED, *extra)
    return colocated_switch_parts(config, NAMED_SHAPES["qwen3-8b"], CARD)


def test_each_part_is_bytes_over_bandwidth_by_hand(profile):
    got = parts()
    assert got["offload"] == pytest.approx(
        2 * 8 * PARAMS / 4 / HOST
    )  # Adam moments over 4 GPUs, out and back
    assert got["engine_weights"] == 0.0  # level 1 keeps the weights on the device
    assert got["kv"] == pytest.approx((100e9 * 0.9 - 2 * PARAMS) / HBM)  # the KV pool zeroed again
    assert got["sync"] == pytest.approx(3 * 2 * PARAMS / HBM)  # CUDA IPC: pack, read, write
    assert got["fixed"] == 0.5
    level_two = parts("cost.switch_sleep_level=2", "cost.switch_offload_bytes_per_param=12")
    assert level_two["engine_weights"] == pytest.approx(2 * 2 * PARAMS / HOST)
    assert level_two["offload"] == pytest.approx(2 * 12 * PARAMS / 4 / HOST)


def test_a_colocated_run_pays_the_switch_in_its_step_and_its_update(profile):
    colocated = _config("qwen3-8b", *COLOCATED)
    split = _config("qwen3-8b")
    got = parts()
    switch = got["offload"] + got["engine_weights"] + got["kv"] + got["fixed"]
    optimizer = 32 * PARAMS / (4e12 * 0.5 * 4)
    assert colocated.trainer.step_overhead_s == pytest.approx(optimizer + switch)
    assert colocated.engine.weight_update_s == pytest.approx(
        got["sync"] + 1.0
    )  # on the device, not the network
    assert split.engine.weight_update_s == pytest.approx(2 * PARAMS / 50e9 + 1.0)


def test_bad_switch_keys_are_refused_by_name(profile):
    with pytest.raises((ConfigError, ValueError), match="cost.switch_sleep_level"):
        load_sim_config(None, ["model=qwen3-8b", "hardware=card.json", "cost.switch_sleep_level=3"])
