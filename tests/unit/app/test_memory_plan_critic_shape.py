"""A separate critic from ``critic.model_path`` is planned at its own shape (``sim.critic_shape``), read from its
``config.json`` in a folder or the offline hub cache, in both directions (a smaller critic beside a larger policy
and the reverse); a path that cannot be read falls back to the policy's shape and the critic's term says why.
Expected bytes are the shapes' arithmetic written out here, not the plan's functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.app import memory_plan as mp
from asyncrl.app.plan_memory import Layout, MemoryCheck
from asyncrl.app.planner import Planner
from asyncrl.cli.main import main
from asyncrl.config.run import load_run_config
from asyncrl.models.tiny import build_tiny_model
from asyncrl.sim.derive import load_sim_config
from asyncrl.sim.model_shape import resolve_shape
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_repo

SMALL = dict(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=96, vocab_size=300)
"""qwen3, head_dim 16 (q 64, kv 32 wide), untied: its body drops the 300 × 64 output layer."""
LARGE = dict(
    hidden_size=128,
    num_layers=5,
    num_heads=8,
    num_kv_heads=4,
    head_dim=16,
    intermediate_size=256,
    vocab_size=512,
)
"""qwen3, q 128 and kv 64 wide, tied: its body keeps the one 512 × 128 embedding."""
SMALL_BODY = 3 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96) + 300 * 64  # layers' q,k,v,o and MLP; embedding
LARGE_BODY = 5 * (128 * (128 + 2 * 64) + 128 * 128 + 3 * 128 * 256) + 512 * 128
SMALL_LAYER_SAVED = (
    6 * 64 + 6 * (64 + 2 * 32) + 4 * 96
)  # elements one layer saves per token (no checkpointing)
LARGE_LAYER_SAVED = 6 * 128 + 6 * (128 + 2 * 64) + 4 * 256
TOKENS = 100


def tiny_config_dir(root: Path, name: str, tied: bool, **shape: int) -> Path:
    """A folder holding only a tiny qwen3's ``config.json`` (what the plan reads; no weights)."""
    model = build_tiny_model(architecture="qwen3", tie_word_embeddings=tied, **shape)
    model.config.save_pretrained(root / name)
    return root / name


def critic_terms(model_path: str, policy_dir: Path, *extra: str) -> dict[str, mp.Term]:
    config = load_run_config(
        None,
        [
            "model.dtype=float32",
            f"trainer.max_tokens_per_microbatch={TOKENS}",
            "trainer.activation_checkpointing=false",
            "advantage.name=gae",
            "critic.type=separate",
            f"critic.model_path={model_path}",
            *extra,
        ],
    )
    return {t.name: t for t in mp.trainer_role(config, resolve_shape(str(policy_dir))).terms}


@pytest.fixture
def shapes(tmp_path: Path) -> tuple[Path, Path]:
    return tiny_config_dir(tmp_path, "small", False, **SMALL), tiny_config_dir(
        tmp_path, "large", True, **LARGE
    )


def test_a_critic_of_another_shape_is_planned_at_its_own(shapes) -> None:
    small, large = shapes
    for critic, policy, body, saved, layers in (
        (small, large, SMALL_BODY, SMALL_LAYER_SAVED, 3),  # a small critic beside a larger policy
        (large, small, LARGE_BODY, LARGE_LAYER_SAVED, 5),  # and the reverse
    ):
        terms = critic_terms(str(critic), policy)
        assert terms["critic weights"].bytes == body * 4  # fp32 weights, one rank
        assert terms["critic activations"].bytes == layers * TOKENS * saved * 4
        assert (
            f"at the shape in the config.json of critic.model_path {str(critic)!r}"
            in terms["critic weights"].how
        )


def test_a_hub_id_in_the_offline_cache_is_read_from_its_config(shapes, tmp_path, monkeypatch) -> None:
    small, large = shapes
    cache = use_offline_cache(monkeypatch, tmp_path / "home")
    write_hub_repo(cache, "org/small-critic", {"config.json": (small / "config.json").read_bytes()})
    assert critic_terms("org/small-critic", large)["critic weights"].bytes == SMALL_BODY * 4


def test_a_hub_critic_is_read_at_its_own_revision_not_the_policys(shapes, tmp_path, monkeypatch) -> None:
    small, large = shapes
    cache = use_offline_cache(monkeypatch, tmp_path / "home")
    first = write_hub_repo(cache, "org/critic", {"config.json": (large / "config.json").read_bytes()})
    write_hub_repo(cache, "org/critic", {"config.json": (small / "config.json").read_bytes()})  # main: small
    policy = write_hub_repo(cache, "org/policy", {"config.json": (large / "config.json").read_bytes()})
    pinned = ("model.path=org/policy", f"model.revision={policy}")  # a commit org/critic does not have
    assert critic_terms("org/critic", large, *pinned)["critic weights"].bytes == SMALL_BODY * 4  # its main
    own = critic_terms("org/critic", small, *pinned, f"critic.revision={first}")  # now the larger one
    assert own["critic weights"].bytes == LARGE_BODY * 4
    assert "at the shape in the config.json of critic.model_path 'org/critic'" in own["critic weights"].how


def test_an_unreadable_critic_falls_back_to_the_policy_and_says_why(shapes, tmp_path, monkeypatch) -> None:
    _, large = shapes
    use_offline_cache(monkeypatch, tmp_path / "home")
    not_a_decoder = tmp_path / "not-a-decoder"
    not_a_decoder.mkdir()
    (not_a_decoder / "config.json").write_text('{"model_type": "bert"}')
    for path, error in (
        (str(tmp_path / "nowhere"), "FileNotFoundError"),  # no such folder, and not a hub id
        ("org/absent-critic", "HubNotCachedError"),  # a hub id the offline cache does not hold
        (str(not_a_decoder), "ValueError"),  # a config.json without a decoder's keys
    ):
        terms = critic_terms(path, large)
        assert terms["critic weights"].bytes == LARGE_BODY * 4  # the policy's body
        assert terms["critic activations"].bytes == 5 * TOKENS * LARGE_LAYER_SAVED * 4
        how = terms["critic weights"].how
        assert f"at the policy's shape, since critic.model_path {path!r} could not be read ({error}" in how


def test_asyncrl_plan_drops_by_the_critics_own_shape(shapes, tmp_path) -> None:
    small, large = shapes
    run = tmp_path / "run.yaml"
    run.write_text(f"advantage: {{name: gae}}\ncritic: {{type: separate, model_path: {small}}}\n")
    sim = load_sim_config(None, [f"model={large}", "hardware=h100", f"memory.train_config={run}"])
    check = MemoryCheck(sim)
    config = check.run_config(Layout(trainer_ranks=1, engines=1, colocated=False))
    planned = mp.plan(config, check.shape, check.longest, check.hardware)
    trainer = {t.name: t for t in planned.roles[0].terms}
    assert trainer["critic weights"].bytes == SMALL_BODY * 4  # the config's model.dtype: float32


def test_asyncrl_plan_prints_which_shape_the_critic_is_costed_at(
    shapes, tmp_path, monkeypatch, capsys
) -> None:
    _, large = shapes
    run = tmp_path / "run.yaml"
    run.write_text(f"advantage: {{name: gae}}\ncritic: {{type: separate, model_path: {tmp_path / 'gone'}}}\n")

    def stop(*args, **kwargs):  # what is printed before the simulations is all this test reads
        raise ValueError("stopped before simulating")

    monkeypatch.setattr(Planner, "search", stop)
    assert main(["plan", f"model={large}", "hardware=h100", f"memory.train_config={run}", "--gpus", "8"]) == 2
    out = capsys.readouterr().out
    assert (
        f"separate critic costed at the policy's shape, since critic.model_path {str(tmp_path / 'gone')!r}"
        in out
    )
