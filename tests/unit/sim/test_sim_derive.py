"""Costs derived from a model shape and a hardware profile, checked against arithmetic done by hand for two
shapes (a dense Qwen3-8B and the Qwen3-30B-A3B mixture of experts), and the config rules around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.sim.derive import load_sim_config
from asyncrl.sim.hardware import (
    Efficiency,
    HardwareProfile,
    profile_from_probe,
    resolve_profile,
    spec_profile,
    write_profile,
)
from asyncrl.sim.model_shape import NAMED_SHAPES, resolve_shape, shape_from_hf_config

RECIPES = Path(__file__).resolve().parents[3] / "asyncrl" / "examples" / "recipes"
ROUND = Efficiency(
    decode_weights=0.5,
    decode_kv=0.5,
    decode_compute=0.5,
    decode_overhead_per_layer_s=1e-4,
    prefill=0.5,
    train=0.25,
    logprob=0.5,
)
CARD = HardwareProfile(
    name="card",
    peak_flops=1e15,
    hbm_bandwidth=4e12,
    hbm_bytes=100e9,
    intra_node_bandwidth=400e9,
    inter_node_bandwidth=50e9,
    efficiency=ROUND,
)


def test_parameter_counts_by_hand():
    dense = NAMED_SHAPES["qwen3-8b"]
    attention = 4096 * (32 * 128 + 2 * 8 * 128) + 32 * 128 * 4096  # q, k, v, o
    mlp = 3 * 4096 * 12288
    assert dense.num_params == 36 * (attention + mlp) + 2 * 151_936 * 4096  # untied: 8.19 B
    assert dense.active_params_per_token == 36 * (attention + mlp) + 151_936 * 4096
    assert dense.kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2  # 147,456 B

    moe = NAMED_SHAPES["qwen3-30b-a3b"]
    attention = 2048 * (32 * 128 + 2 * 4 * 128) + 32 * 128 * 2048
    experts, router = 3 * 2048 * 768, 2048 * 128
    assert moe.num_params == 48 * (attention + 128 * experts + router) + 2 * 151_936 * 2048  # 30.5 B
    assert moe.active_params_per_token == 48 * (attention + 8 * experts + router) + 151_936 * 2048  # 3.0 B
    assert round(moe.num_params / 1e9, 1) == 30.5 and round(dense.num_params / 1e9, 2) == 8.19


def _config(model: str, *extra: str):
    return load_sim_config(
        None,
        [
            f"model={model}",
            "hardware=card.json",
            "prompt_tokens=1000",
            "lengths.distribution=constant",
            "lengths.mean=3000",
            "rollout.max_new_tokens=8000",
            "trainer.num_gpus=4",
            *extra,
        ],
    )


@pytest.fixture
def card(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_profile(CARD, tmp_path / "card.json")


def test_dense_engine_and_trainer_costs_by_hand(card):
    config = _config("qwen3-8b")
    engine, trainer = config.engine, config.trainer
    layers_and_head = 36 * (41_943_040 + 150_994_944) + 622_329_856  # weights a decode step reads
    assert engine.decode_step_s == pytest.approx(2 * layers_and_head / (4e12 * 0.5))  # 7.57 ms
    per_request = 2 * layers_and_head / (1e15 * 0.5)  # compute of one row
    assert engine.knee_batch == round(engine.decode_step_s / per_request)  # = 250
    assert engine.decode_overhead_s == pytest.approx(36 * 1e-4)
    assert engine.kv_s_per_token == pytest.approx(147_456 / (4e12 * 0.5))
    forward_500 = 2 * layers_and_head + 4 * 36 * 32 * 128 * 500  # a prompt token attends to 500 on average
    assert engine.prefill_s_per_token == pytest.approx(forward_500 / (1e15 * 0.5))
    kv_fit = (100e9 * 0.9 - 2 * 8_190_427_136) // 147_456  # memory share minus weights, in KV tokens
    # KV bytes per token: 36 layers x (keys, values) x 8 KV heads x 128 dims x 2 bytes = 147,456
    assert engine.kv_bytes_per_token == 36 * 2 * 8 * 128 * 2
    assert engine.kv_allocation == "paged"  # contexts fill the KV as they grow; the slots are max_num_seqs
    assert (engine.max_kv_tokens, engine.max_running_requests) == (kv_fit, 256)
    assert engine.weight_update_s == pytest.approx(2 * 8_190_427_136 / 50e9 + 1.0)
    # Training: constant 4000-token sequences, a token attends to 2000 positions on average.
    forward_2000 = 2 * layers_and_head + 4 * 36 * 32 * 128 * 2000
    assert trainer.gpu_s_per_token == pytest.approx(
        3 * forward_2000 / (1e15 * 0.25) + forward_2000 / (1e15 * 0.5)
    )
    assert trainer.step_overhead_s == pytest.approx(32 * 8_190_427_136 / (4e12 * 0.5 * 4))


def test_moe_reads_every_expert_but_computes_with_the_active_ones(card):
    config = _config("qwen3-30b-a3b", "engine.gpus_per_engine=2")
    read = 48 * (10_485_760 + 8_388_608 + 128 * 4_718_592 + 262_144) + 311_164_928
    active = 48 * (10_485_760 + 8_388_608 + 8 * 4_718_592 + 262_144) + 311_164_928
    assert config.engine.decode_step_s == pytest.approx(2 * read / (4e12 * 0.5))
    assert config.engine.knee_batch == round((2 * read / 2e12) / (2 * active / 5e14))
    weights = 2 * (48 * (10_485_760 + 8_388_608 + 128 * 4_718_592 + 262_144) + 2 * 311_164_928)
    kv_fit = 2 * (100e9 * 0.9 - weights / 2) // (2 * 48 * 4 * 128 * 2)
    assert config.engine.max_kv_tokens == kv_fit


def test_explicit_keys_win_and_model_needs_hardware(card):
    assert _config("qwen3-8b", "engine.max_running_requests=64").engine.max_running_requests == 64
    assert _config("qwen3-8b", "trainer.step_overhead_s=5").trainer.step_overhead_s == 5
    with pytest.raises(ValueError, match="model and hardware go together"):
        load_sim_config(None, ["model=qwen3-8b"])
    with pytest.raises(ValueError, match="does not fit an engine of 1 card GPU"):
        _config("qwen3-235b-a22b")
    with pytest.raises(ValueError, match="neither a named shape"):
        _config("qwen9-1t")
    with pytest.raises(ConfigError):
        load_sim_config(None, ["cost.kv=virtual"])


def test_reserved_kv_runs_the_slots_its_reservations_fill(card):
    """The built-in engine preallocates every slot at the longest context and admits as many as the KV holds,
    so its slots are ``cost.max_num_seqs`` capped at that: 499,261 KV tokens hold 55 contexts of 9,000 tokens,
    110 capped at 4,500 (``engine.max_model_len``); 32 slots stay 32."""
    config = _config("qwen3-8b", "cost.kv=reserved", "cost.max_num_seqs=128")
    kv = (100e9 * 0.9 - 2 * 8_190_427_136) // 147_456
    assert config.engine.max_kv_tokens == kv == 499_261
    assert config.engine.max_running_requests == kv // 9000 == 55
    assert config.engine.kv_allocation == "reserved"
    capped = _config("qwen3-8b", "cost.kv=reserved", "cost.max_num_seqs=128", "engine.max_model_len=4500")
    assert capped.engine.max_running_requests == kv // 4500 == 110
    assert _config("qwen3-8b", "cost.kv=reserved", "cost.max_num_seqs=32").engine.max_running_requests == 32
    explicit = _config("qwen3-8b", "cost.kv=reserved", "engine.max_running_requests=200")
    assert explicit.engine.max_running_requests == 200  # an explicit key still wins
    assert _config("qwen3-8b").engine.max_running_requests == 256  # paged (vLLM): max_num_seqs, preempting


def test_a_training_configs_engine_is_the_one_simulated(card):
    """``memory.train_config`` plans a recipe's engine, so the simulation runs that engine too: the built-in
    one's slots, KV budget and context cap as they are (its admission then runs 44 of 1,536-token contexts at
    once), vLLM's sequences and memory share; a simulator key that says otherwise is refused by name."""
    gsm8k, dapo = (
        f"memory.train_config={RECIPES / name}" for name in ("gsm8k_1gpu.yaml", "dapo_math_8gpu.yaml")
    )
    builtin = _config("qwen3-8b", gsm8k).engine
    assert (builtin.kv_allocation, builtin.max_running_requests) == ("reserved", 44)
    assert (builtin.max_kv_tokens, builtin.max_model_len) == (65536, 1536)
    vllm = _config("qwen3-8b", dapo)
    assert (vllm.engine.kv_allocation, vllm.engine.max_running_requests) == ("paged", 256)
    assert vllm.cost.memory_utilization == 0.85 and vllm.engine.max_model_len == 9216
    assert _config("qwen3-8b", dapo, "cost.kv=paged").engine.kv_allocation == "paged"  # the same: kept
    with pytest.raises(ValueError, match="cost.kv='paged' disagrees with memory.train_config .*gsm8k_1gpu"):
        _config("qwen3-8b", gsm8k, "cost.kv=paged")
    with pytest.raises(ValueError, match="engine.max_running_requests=256 disagrees"):
        _config("qwen3-8b", gsm8k, "engine.max_running_requests=256")


def test_shapes_from_a_hf_config_and_by_name(tmp_path):
    hf = {
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 151_936,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    from_file = resolve_shape(str(tmp_path))
    assert from_file.num_params == NAMED_SHAPES["qwen3-8b"].num_params
    assert shape_from_hf_config(hf | {"head_dim": None}).head_dim == 128  # hidden / heads
    with pytest.raises(ValueError, match="no 'vocab_size'"):
        shape_from_hf_config({k: v for k, v in hf.items() if k != "vocab_size"})


def test_spec_profiles_carry_the_measured_efficiencies_scaled_to_spec_ceilings():
    measured = resolve_profile("h200-measured")
    h200, h800 = spec_profile("h200"), spec_profile("h800")
    # Absolute rates agree on the device that was measured ...
    assert h200.peak_flops * h200.efficiency.train == pytest.approx(
        measured.peak_flops * measured.efficiency.train
    )
    assert h200.hbm_bandwidth * h200.efficiency.decode_kv == pytest.approx(
        measured.hbm_bandwidth * measured.efficiency.decode_kv
    )
    # ... and another card keeps the fractions of its own datasheet.
    assert h800.efficiency.train == h200.efficiency.train and h800.hbm_bandwidth == 3.35e12
    assert "efficiencies measured on h200-measured" in h800.source


def test_the_committed_profile_is_the_fit_of_the_committed_probe():
    with open("docs/gpu-smoke/2026-11-27-h200-probe.json") as f:
        probe = json.load(f)
    fitted = profile_from_probe(probe, source="x")
    committed = resolve_profile("h200-measured")
    assert fitted.efficiency == committed.efficiency
    assert fitted.peak_flops == committed.peak_flops and fitted.hbm_bandwidth == committed.hbm_bandwidth
