"""The colocated switch's cost term: bytes moved over the host link and the device, over the profile's
bandwidths, plus a fixed part; checked by hand for Qwen3-8B on a round-number card."""

from __future__ import annotations

import pytest
from test_sim_derive import CARD, _config

from asyncrl.config.base import ConfigError
from asyncrl.sim.decode_captures import capture_overhead, decode_shapes, uses_per_shape
from asyncrl.sim.derive import colocated_switch_parts, decode_read_bytes, load_sim_config
from asyncrl.sim.hardware import write_profile
from asyncrl.sim.model_shape import NAMED_SHAPES
from asyncrl.sim.workload import LengthModel

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
    assert got["recapture"] == 0.0  # vLLM (paged) keeps its CUDA graphs asleep
    assert got["fixed"] == 0.5
    level_two = parts("cost.switch_sleep_level=2", "cost.switch_offload_bytes_per_param=12")
    assert level_two["engine_weights"] == pytest.approx(2 * 2 * PARAMS / HOST)
    assert level_two["offload"] == pytest.approx(2 * 12 * PARAMS / 4 / HOST)


def test_a_colocated_run_pays_the_switch_in_its_step_and_its_update(profile):
    colocated = _config("qwen3-8b", *COLOCATED)
    split = _config("qwen3-8b")
    got = parts()
    switch = got["offload"] + got["engine_weights"] + got["kv"] + got["recapture"] + got["fixed"]
    optimizer = 32 * PARAMS / (4e12 * 0.5 * 4)
    assert colocated.trainer.step_overhead_s == pytest.approx(optimizer + switch)
    assert colocated.engine.weight_update_s == pytest.approx(
        got["sync"] + 1.0
    )  # on the device, not the network
    assert split.engine.weight_update_s == pytest.approx(2 * PARAMS / 50e9 + 1.0)


def test_bad_switch_keys_are_refused_by_name(profile):
    with pytest.raises((ConfigError, ValueError), match="cost.switch_sleep_level"):
        load_sim_config(None, ["model=qwen3-8b", "hardware=card.json", "cost.switch_sleep_level=3"])


BUILT_IN = (
    "model=qwen3-8b",
    "hardware=card.json",
    "trainer.colocated=true",
    "trainer.num_gpus=1",
    "cost.kv=reserved",
    "prompt_tokens=100",
    "lengths.mean=200",
    "rollout.max_new_tokens=400",
    "rollout.rollout_batch_size=8",
    "rollout.num_return_sequences=4",
    "rollout.num_engines=2",
    "engine.max_running_requests=6",
    "engine.max_kv_tokens=3000",
)


def test_a_built_in_engine_captures_its_decode_shapes_again_after_each_wake(profile):
    """``recapture``: one engine's share of the step (16 of 32 requests) through the real scheduler at the
    engine's own slots and KV budget. Captured at first use (``cost.decode_graph_min_uses`` 1, the engine's
    default) the overhead is three eager steps per distinct shape; an eager step is the derived replayed step
    (weights read at the card's efficiency, plus its per-layer overhead) over ``cost.decode_replay_ratio``."""
    config = load_sim_config(None, list(BUILT_IN))
    lengths = LengthModel(config.lengths, 400, config.seed)
    outputs = [lengths(f"q{i // 4}@0#{i % 4}") for i in range(16)]
    shapes = decode_shapes([100] * 16, outputs, num_slots=6, max_model_len=500, max_kv_tokens=3000)
    replay_s = decode_read_bytes(config, NAMED_SHAPES["qwen3-8b"]) / (4e12 * 0.5) + 36 * 1e-4
    parts = colocated_switch_parts(config, NAMED_SHAPES["qwen3-8b"], CARD)
    expected = 3 * len(set(shapes)) * replay_s / 0.15
    assert parts["recapture"] == pytest.approx(expected)
    assert config.trainer.step_overhead_s == pytest.approx(
        32 * PARAMS / (4e12 * 0.5 * config.num_train_gpus)
        + sum(s for part, s in parts.items() if part != "sync")
    )
    later = load_sim_config(None, [*BUILT_IN, "cost.decode_graph_min_uses=4", "cost.decode_replay_ratio=0.3"])
    delayed = colocated_switch_parts(later, NAMED_SHAPES["qwen3-8b"], CARD)["recapture"]
    uses = uses_per_shape(shapes)
    assert delayed == pytest.approx(capture_overhead(uses, 4, 0.3) * replay_s / 0.3)
    assert any(count < 4 for count in uses) and any(count >= 4 for count in uses)  # both sides of the rule


def test_bad_capture_keys_are_refused_by_name(profile):
    with pytest.raises((ConfigError, ValueError), match="cost.decode_graph_min_uses"):
        load_sim_config(None, [*BUILT_IN, "cost.decode_graph_min_uses=0"])
    with pytest.raises((ConfigError, ValueError), match="cost.decode_replay_ratio"):
        load_sim_config(None, [*BUILT_IN, "cost.decode_replay_ratio=0"])
