"""A critic's and LoRA's time in the derived costs (``asyncrl.sim.trained``), by hand on Qwen3-8B and the
``card`` profile of ``test_sim_derive`` (peak 1e15 FLOP/s, η_train 0.25, η_logprob 0.5, HBM 4e12 B/s at
η 0.5, network 50e9 B/s, 4 trainer GPUs), constant 4000-token sequences: a trained token attends to 2000."""

from __future__ import annotations

import pytest
import yaml
from test_sim_derive import CARD, _config, card  # noqa: F401  (the fixture)

from asyncrl.sim.derive import colocated_switch_parts, load_sim_config
from asyncrl.sim.model_shape import NAMED_SHAPES
from asyncrl.sim.trained import TrainedParts, critic_flops, trained_parts
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_repo
from tests.unit.app.test_memory_plan_critic_shape import SMALL, SMALL_BODY, tiny_config_dir

PARAMS = 8_190_427_136  # Qwen3-8B, untied
OUTPUT = 151_936 * 4096  # its output layer (and its input embedding)
A = 36 * (41_943_040 + 150_994_944) + OUTPUT  # weights a token multiplies
F = 2 * A + 4 * 36 * 32 * 128 * 2000  # one forward at 2000 attended positions
L = 36 * 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 12288))  # rank-16 adapters
HEAD = 4096 + 1  # a value head
TRAIN, LOGPROB, ADAMW = 1e15 * 0.25, 1e15 * 0.5, 4e12 * 0.5 * 4


def test_lora_counts_by_hand():
    dense, moe = NAMED_SHAPES["qwen3-8b"], NAMED_SHAPES["qwen3-30b-a3b"]
    assert dense.lora_params(16) == dense.active_lora_params(16) == L == 43_646_976
    attention, expert = (2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048), 3 * (2048 + 768)
    assert moe.lora_params(8) == 48 * 8 * (attention + 128 * expert)  # every expert's adapters
    assert moe.active_lora_params(8) == 48 * 8 * (attention + 8 * expert)  # a token's 8 experts'
    assert dense.body_params == PARAMS - OUTPUT and NAMED_SHAPES["qwen3-4b"].body_params == (
        NAMED_SHAPES["qwen3-4b"].num_params  # tied: the body keeps the one embedding
    )


def test_full_training_is_unchanged(card):  # noqa: F811
    trainer = _config("qwen3-8b").trainer
    assert trainer.gpu_s_per_token == pytest.approx(3 * F / TRAIN + F / LOGPROB)
    assert trainer.step_overhead_s == pytest.approx(32 * PARAMS / ADAMW)


def test_lora_drops_the_frozen_weights_gradients_and_ships_the_adapters(card):  # noqa: F811
    config = _config("qwen3-8b", "memory.lora_rank=16")
    # forward 2A + backward activation gradients 2A (not 4A), attention 3x its forward, adapters 6L
    assert config.trainer.gpu_s_per_token == pytest.approx(
        (3 * F - 2 * A + 6 * L) / TRAIN + (F + 2 * L) / LOGPROB
    )
    assert config.trainer.step_overhead_s == pytest.approx(32 * L / ADAMW)  # AdamW over the adapters
    assert config.engine.weight_update_s == pytest.approx(2 * L / 50e9 + 1.0)  # adapter pairs in bf16
    per_request = 2 * (A + L) / (1e15 * 0.5)  # vLLM (paged) multiplies the unmerged adapters every step
    assert config.engine.knee_batch == round(config.engine.decode_step_s / per_request)
    plain = _config("qwen3-8b").trainer
    assert config.trainer.gpu_s_per_token < 0.8 * plain.gpu_s_per_token  # 4N+F against 6N+F, about


def test_the_built_in_engine_merges_each_adapter_update(card):  # noqa: F811
    engine = _config("qwen3-8b", "cost.kv=reserved", "memory.lora_rank=16").engine
    adapted = PARAMS - 2 * OUTPUT  # every layer's linears
    merge = max(2 * adapted * 2 / (4e12 * 0.5), 2 * 16 * adapted / (1e15 * 0.5))  # read W0, write W: 13.9 ms
    assert engine.weight_update_s == pytest.approx(2 * L / 50e9 + merge + 1.0)


def test_a_separate_critic_adds_its_body_passes_and_optimizer(card):  # noqa: F811
    config = _config("qwen3-8b", "memory.critic=separate")
    body = F - 2 * OUTPUT + 2 * HEAD  # no output layer, a value head
    assert config.trainer.gpu_s_per_token == pytest.approx((3 * F + 3 * body) / TRAIN + (F + body) / LOGPROB)
    assert config.trainer.step_overhead_s == pytest.approx(32 * (PARAMS + PARAMS - OUTPUT + HEAD) / ADAMW)
    assert config.engine.weight_update_s == _config("qwen3-8b").engine.weight_update_s  # never synced
    with_lora = _config("qwen3-8b", "memory.critic=separate", "memory.lora_rank=16").trainer
    assert with_lora.gpu_s_per_token == pytest.approx(  # the critic trains in full whatever the policy does
        (3 * F - 2 * A + 6 * L + 3 * body) / TRAIN + (F + 2 * L + body) / LOGPROB
    )


def test_a_shared_trunk_costs_its_head_and_at_least_one_forward(card):  # noqa: F811
    shared = _config("qwen3-8b", "memory.critic=shared_trunk").trainer
    assert shared.gpu_s_per_token == pytest.approx((3 * F + 6 * HEAD) / TRAIN + (F + 2 * HEAD) / LOGPROB)
    plain = _config("qwen3-8b").trainer
    assert shared.gpu_s_per_token / plain.gpu_s_per_token - 1 < 1e-5  # the head: negligible
    trusting = _config("qwen3-8b", "memory.critic=shared_trunk", "cost.logprob_passes=0").trainer
    assert trusting.gpu_s_per_token == pytest.approx((3 * F + 6 * HEAD) / TRAIN + (F + 2 * HEAD) / LOGPROB)
    # with the engine's log-probs trusted, the step-start values still need the policy's forward
    assert _config("qwen3-8b", "cost.logprob_passes=0").trainer.gpu_s_per_token == pytest.approx(
        3 * F / TRAIN
    )


def test_the_colocated_switch_moves_what_lora_and_a_critic_hold(card):  # noqa: F811
    keys = ("trainer.colocated=true", "memory.lora_rank=16", "memory.critic=separate")
    critic = PARAMS - OUTPUT + HEAD
    host, hbm = CARD.host_link_bandwidth, 4e12 * 0.5
    for per_param, state in (
        (8, 8 * (L + critic)),  # AdamW's moments: the adapters' and the critic's
        (12, 8 * (L + critic) + 4 * (PARAMS + critic)),  # master weights of every weight, frozen ones too
        (16, 12 * (L + critic) + 4 * (PARAMS + critic)),  # gradients: trained parameters only
    ):
        config = _config("qwen3-8b", *keys, f"cost.switch_offload_bytes_per_param={per_param}")
        parts = colocated_switch_parts(config, NAMED_SHAPES["qwen3-8b"], CARD)
        assert parts["offload"] == pytest.approx(2 * state / config.num_train_gpus / host)
        assert parts["sync"] == pytest.approx(3 * 2 * L / hbm)  # the adapters by CUDA IPC


def test_the_parts_come_from_the_training_config_when_one_is_named(tmp_path):
    run = {"advantage": {"name": "gae"}, "critic": {"type": "separate"}, "trainer": {"lora": {"rank": 8}}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    config = load_sim_config(
        None, [f"memory.train_config={tmp_path / 'run.yaml'}", "memory.critic=shared_trunk"]
    )
    assert trained_parts(config) == TrainedParts("separate", 8)  # memory.critic is the training config's then
    assert trained_parts(load_sim_config(None, ["memory.lora_rank=4"])) == TrainedParts("none", 4)
    with pytest.raises(ValueError, match="critic must be"):
        critic_flops(NAMED_SHAPES["qwen3-8b"], 100, "value")


def _critic_run(tmp_path, model_path, **run_keys) -> str:
    """A training config whose separate critic starts from ``model_path``, as ``memory.train_config``;
    ``run_keys``: more sections, or the critic's other keys under ``critic``."""
    critic = {"type": "separate", "model_path": str(model_path), **run_keys.pop("critic", {})}
    run = {"advantage": {"name": "gae"}, "critic": critic, **run_keys}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    return f"memory.train_config={tmp_path / 'run.yaml'}"


def test_a_critic_of_its_own_shape_is_costed_at_it(card, tmp_path):  # noqa: F811
    critic = tiny_config_dir(tmp_path, "small", False, **SMALL)  # a 111k-parameter critic beside Qwen3-8B
    config = _config("qwen3-8b", _critic_run(tmp_path, critic))
    layers = 3 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)  # its q,k,v,o and MLP weights: no output layer
    body = 2 * layers + 4 * 3 * 4 * 16 * 2000 + 2 * (64 + 1)  # its forward at 2000 positions, and its head
    assert config.trainer.gpu_s_per_token == pytest.approx((3 * F + 3 * body) / TRAIN + (F + body) / LOGPROB)
    assert config.trainer.step_overhead_s == pytest.approx(32 * (PARAMS + SMALL_BODY + 65) / ADAMW)
    assert "the shape in the config.json of critic.model_path" in trained_parts(config).critic_shape.source


def test_a_hub_critic_is_costed_at_its_own_revision_beside_a_pinned_policy(card, tmp_path, monkeypatch):  # noqa: F811
    small = tiny_config_dir(tmp_path, "small", False, **SMALL)
    cache = use_offline_cache(monkeypatch, tmp_path / "home")
    commit = write_hub_repo(cache, "org/critic", {"config.json": (small / "config.json").read_bytes()})
    write_hub_repo(cache, "org/critic", {"config.json": b"{}"})  # main moved on to an unreadable commit
    run = _critic_run(
        tmp_path,
        "org/critic",
        critic={"revision": commit},
        model={"path": "org/policy", "revision": "c" * 40},
    )
    config = _config("qwen3-8b", run)
    assert config.trainer.step_overhead_s == pytest.approx(32 * (PARAMS + SMALL_BODY + 65) / ADAMW)
    assert "the shape in the config.json of critic.model_path" in trained_parts(config).critic_shape.source


def test_an_unreadable_critic_is_costed_at_the_policys_shape_with_the_reason(card, tmp_path):  # noqa: F811
    config = _config("qwen3-8b", _critic_run(tmp_path, tmp_path / "nowhere"))
    body = F - 2 * OUTPUT + 2 * HEAD
    assert config.trainer.gpu_s_per_token == pytest.approx((3 * F + 3 * body) / TRAIN + (F + body) / LOGPROB)
    source = trained_parts(config).critic_shape.source
    assert source.startswith("the policy's shape, since critic.model_path") and "could not be read" in source


QWEN3_1_7B_LAYER = 2048 * (2048 + 2 * 1024) + 2048 * 2048 + 3 * 2048 * 6144  # q,k,v,o and its MLP
QWEN3_1_7B_BODY = 28 * QWEN3_1_7B_LAYER + 151_936 * 2048  # tied: the body keeps the one embedding


def test_memory_critic_model_costs_the_critic_at_its_shape_without_a_training_config(card, tmp_path):  # noqa: F811
    small = tiny_config_dir(tmp_path, "small", False, **SMALL)  # a folder's config.json
    config = _config("qwen3-8b", "memory.critic=separate", f"memory.critic_model={small}")
    layers = 3 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
    body = 2 * layers + 4 * 3 * 4 * 16 * 2000 + 2 * (64 + 1)
    assert config.trainer.gpu_s_per_token == pytest.approx((3 * F + 3 * body) / TRAIN + (F + body) / LOGPROB)
    assert config.trainer.step_overhead_s == pytest.approx(32 * (PARAMS + SMALL_BODY + 65) / ADAMW)
    # a named shape: Qwen3-1.7B's body beside the 8B policy, its 28 layers of 16 heads at 2000 positions
    named = _config("qwen3-8b", "memory.critic=separate", "memory.critic_model=qwen3-1.7b")
    body = 2 * 28 * QWEN3_1_7B_LAYER + 4 * 28 * 16 * 128 * 2000 + 2 * (2048 + 1)
    assert named.trainer.gpu_s_per_token == pytest.approx((3 * F + 3 * body) / TRAIN + (F + body) / LOGPROB)
    critic = QWEN3_1_7B_BODY + 2048 + 1
    assert named.trainer.step_overhead_s == pytest.approx(32 * (PARAMS + critic) / ADAMW)
    assert trained_parts(named).critic_shape.source == "the shape memory.critic_model names, 'qwen3-1.7b'"
    colocated = _config(
        "qwen3-8b", "memory.critic=separate", "memory.critic_model=qwen3-1.7b", "trainer.colocated=true"
    )
    offload = colocated_switch_parts(colocated, NAMED_SHAPES["qwen3-8b"], CARD)["offload"]
    state = 8 * (PARAMS + critic)  # AdamW's moments of the policy and the 1.7B critic
    assert offload == pytest.approx(2 * state / colocated.num_train_gpus / CARD.host_link_bandwidth)
