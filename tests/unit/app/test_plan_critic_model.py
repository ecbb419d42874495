"""``memory.critic_model`` names a separate critic's body for ``asyncrl plan`` without a training config: a
named shape, a folder's ``config.json`` or a hub id in the offline cache. The memory plan's critic terms and the
fit filter follow it, the CLI prints it, and a key that would be ignored or does not read is refused naming it.
Expected bytes are the shapes' arithmetic written out (``test_memory_plan_critic_shape``'s tiny shapes)."""

from __future__ import annotations

import pytest

from asyncrl.app import memory_plan as mp
from asyncrl.app.plan_memory import Layout, MemoryCheck
from asyncrl.app.planner import Planner
from asyncrl.cli.main import main
from asyncrl.sim.derive import load_sim_config
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_repo
from tests.unit.app.test_memory_plan_critic_shape import (
    LARGE_BODY,
    LARGE_LAYER_SAVED,
    SMALL_BODY,
    SMALL_LAYER_SAVED,
    TOKENS,
    shapes,  # noqa: F401  (the fixture)
)
from tests.unit.app.test_plan_memory import WORKLOAD_8B, verdicts

QWEN3_1_7B_BODY = 28 * (2048 * (2048 + 2 * 1024) + 2048 * 2048 + 3 * 2048 * 6144) + 151_936 * 2048  # tied


def trainer_terms(policy: str, *memory: str, ranks: int = 1) -> dict[str, mp.Term]:
    """The trainer rank's terms ``asyncrl plan`` plans for a split layout of ``ranks`` trainer GPUs: fp32
    masters and compute, no checkpointing, ``TOKENS`` per micro-batch, a separate critic."""
    sim = load_sim_config(
        None,
        [
            f"model={policy}",
            "hardware=h100",
            "memory.mixed_precision=false",
            "memory.activation_checkpointing=false",
            f"memory.max_tokens_per_microbatch={TOKENS}",
            "memory.critic=separate",
            *memory,
        ],
    )
    check = MemoryCheck(sim)
    config = check.run_config(Layout(trainer_ranks=ranks, engines=1, colocated=False))
    planned = mp.plan(config, check.shape, check.longest, check.hardware, critic=check.critic)
    return {t.name: t for t in planned.roles[0].terms}


def test_the_plans_critic_terms_are_at_the_shape_memory_critic_model_names(shapes) -> None:  # noqa: F811
    small, large = shapes
    for critic, policy, body, saved, layers in (
        (small, large, SMALL_BODY, SMALL_LAYER_SAVED, 3),  # a small critic beside a larger policy
        (large, small, LARGE_BODY, LARGE_LAYER_SAVED, 5),  # and the reverse
    ):
        terms = trainer_terms(str(policy), f"memory.critic_model={critic}")
        assert terms["critic weights"].bytes == body * 4  # fp32 weights, one rank
        assert terms["critic activations"].bytes == layers * TOKENS * saved * 4
        assert f"at the shape memory.critic_model names, {str(critic)!r}" in terms["critic weights"].how
    copy = trainer_terms(str(large))  # no memory.critic_model: a copy of the policy, as before
    assert copy["critic weights"].bytes == LARGE_BODY * 4
    assert "at the policy's shape (no critic.model_path: a copy of the policy)" in copy["critic weights"].how


def test_a_named_shape_and_a_cached_hub_id_are_read(shapes, tmp_path, monkeypatch) -> None:  # noqa: F811
    named = trainer_terms("qwen3-8b", "memory.critic_model=qwen3-1.7b", ranks=8)
    assert named["critic weights"].bytes == -(-QWEN3_1_7B_BODY * 4 // 8)  # sharded over the 8 ranks
    small, large = shapes
    cache = use_offline_cache(monkeypatch, tmp_path / "home")
    write_hub_repo(cache, "org/small-critic", {"config.json": (small / "config.json").read_bytes()})
    hub = trainer_terms(str(large), "memory.critic_model=org/small-critic")
    assert hub["critic weights"].bytes == SMALL_BODY * 4


def test_the_fit_filter_follows_the_critics_shape() -> None:
    copy = verdicts([*WORKLOAD_8B, "memory.critic=separate"], 8)
    small = verdicts([*WORKLOAD_8B, "memory.critic=separate", "memory.critic_model=qwen3-0.6b"], 8)
    assert copy["partial_rollout a=2 3T/5I"].startswith("each trainer GPU needs")  # an 8B critic
    assert small["partial_rollout a=2 3T/5I"] == "fits"  # a 0.6B one fits on 3 trainer GPUs


def test_asyncrl_plan_prints_the_shape_memory_critic_model_names(monkeypatch, capsys) -> None:
    def stop(*args, **kwargs):  # what is printed before the simulations is all this test reads
        raise ValueError("stopped before simulating")

    monkeypatch.setattr(Planner, "search", stop)
    base = ["plan", "model=qwen3-8b", "hardware=h100", "memory.critic=separate"]
    assert main([*base, "memory.critic_model=qwen3-1.7b", "--gpus", "8"]) == 2
    assert (
        "separate critic costed at the shape memory.critic_model names, 'qwen3-1.7b'"
        in capsys.readouterr().out
    )
    assert main([*base, "--gpus", "8"]) == 2
    out = capsys.readouterr().out
    assert (
        "separate critic costed at the policy's shape (a copy of the policy: no critic.model_path or " in out
    )


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        (
            ["memory.critic_model=qwen3-1.7b"],
            r"memory.critic_model \('qwen3-1.7b'\).*memory.critic is 'none'",
        ),
        (
            ["memory.critic=shared_trunk", "memory.critic_model=qwen3-1.7b"],
            r"memory.critic_model \('qwen3-1.7b'\).*memory.critic is 'shared_trunk'",
        ),
        (
            ["memory.critic=separate", "memory.critic_model=qwen3-1.7b", "memory.train_config=run.yaml"],
            r"memory.critic_model \('qwen3-1.7b'\) is set beside memory.train_config \('run.yaml'\)",
        ),
        (["memory.critic=separate", 'memory.critic_model=""'], "memory.critic_model must name a shape"),
    ],
)
def test_a_critic_model_that_would_be_ignored_is_refused(keys: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        load_sim_config(None, ["model=qwen3-8b", "hardware=h100", *keys])


def test_a_critic_model_that_does_not_read_is_an_error_naming_the_key(tmp_path, monkeypatch) -> None:
    use_offline_cache(monkeypatch, tmp_path / "home")
    empty = tmp_path / "no-config"
    empty.mkdir()
    for spec, error in (
        (
            "qwen3-1.8b",
            r"memory.critic_model 'qwen3-1.8b' is neither a named shape \(.*qwen3-1.7b.*HubNotCached",
        ),
        ("org/absent-critic", r"memory.critic_model 'org/absent-critic' is neither .*HubNotCachedError"),
        (str(tmp_path / "nowhere"), r"memory.critic_model '.*nowhere' is neither .*FileNotFoundError"),
        (str(empty), r"memory.critic_model: model '.*no-config' is neither a named shape"),
    ):
        with pytest.raises(ValueError, match=error):  # at load: the derived costs read the critic's shape
            load_sim_config(
                None,
                ["model=qwen3-8b", "hardware=h100", "memory.critic=separate", f"memory.critic_model={spec}"],
            )
