"""The bound a checkpoint's deadline scales with (``trainer.checkpoint_size``): the same from a meta skeleton as
from the loaded model, the memory plan's sharded checkpoint size for a full fine-tune (which
``tests/unit/app/test_checkpoint_bytes_measured.py`` holds within 3 % of real files), and larger with a critic."""

from __future__ import annotations

from asyncrl.app import memory_plan as mp
from asyncrl.config.run import load_run_config
from asyncrl.models.loading import load_configured_model, load_configured_skeleton
from asyncrl.sim.model_shape import shape_from_hf_config
from asyncrl.trainer.checkpoint_size import checkpoint_bytes

SHARDED = ["runtime.type=local", "trainer.num_workers=2", "model.dtype=float32", "engine.dtype=bfloat16"]


def test_the_bound_is_the_sharded_checkpoint_the_memory_plan_measures() -> None:
    config = load_run_config(None, SHARDED)
    skeleton, _ = load_configured_skeleton(config.model)
    model, _ = load_configured_model(config.model)
    bound = checkpoint_bytes(config, skeleton)
    assert bound == checkpoint_bytes(config, model)  # a rank sizes it before any weight is read
    planned = mp.checkpoint_bytes(config, shape_from_hf_config(model.config.to_dict()), "cpu").each
    assert abs(bound / planned - 1) < 0.01, (bound, planned)


def test_a_critic_copy_of_the_policy_adds_its_weights_and_moments() -> None:
    config = load_run_config(None, SHARDED)
    with_critic = load_run_config(None, [*SHARDED, "critic.type=separate", "advantage.name=gae"])
    skeleton, _ = load_configured_skeleton(config.model)
    weights = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    assert checkpoint_bytes(with_critic, skeleton) - checkpoint_bytes(config, skeleton) == 3 * weights
