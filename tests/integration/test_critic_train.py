"""PPO with a critic end to end, in every mode: ``advantage.name=gae`` trains the policy and the critic, each
mode keeps its freshness promise, only the policy reaches the engines, and a resumed run keeps its critic."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_modes import (
    check_multi_version_run,
    check_run,
    monotone_versions,
    one_version_per_trajectory,
    run_mode,
)

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config

MODES = {
    "sync": (("controller.mode=sync",), 0.0, one_version_per_trajectory, "separate"),
    "one_step_off": (
        ("controller.mode=one_step_off", "buffer.async_ratio=1"),
        1.0,
        one_version_per_trajectory,
        "shared_trunk",
    ),
    "async": (("controller.mode=async", "buffer.async_ratio=2"), 2.0, one_version_per_trajectory, "separate"),
    "partial_rollout": (
        ("controller.mode=partial_rollout", "buffer.async_ratio=1"),
        1.0,
        monotone_versions,
        "shared_trunk",
    ),
}
"""Each mode with one critic type (the two alternate); multi_version below."""


def critic(kind: str) -> tuple[str, ...]:
    return ("advantage.name=gae", f"critic.type={kind}", "critic.lr=1e-3")


def assert_critic_trained(lines: list[dict], checkpoint: Path) -> None:
    """Every step reports the critic; its values leave zero (the head starts at zero) and it is checkpointed."""
    assert all(
        "train/critic/value_loss" in line and "train/critic/explained_variance" in line for line in lines
    )
    assert lines[0]["train/critic/values_mean"] == 0.0 and lines[-1]["train/critic/values_mean"] != 0.0
    assert (checkpoint / "critic" / "model.safetensors").is_file()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_critic_run_keeps_each_modes_promises(tiny_path, tmp_path, mode):
    overrides, async_ratio, versions_ok, kind = MODES[mode]
    records, lines = run_mode(tiny_path, tmp_path, *overrides, *critic(kind))
    check_run(records, lines, async_ratio=async_ratio, versions_ok=versions_ok)
    assert_critic_trained(lines, latest_checkpoint(tmp_path))


def test_multi_version_with_a_critic(tiny_path, tmp_path):
    check_multi_version_run(tiny_path, tmp_path, *critic("separate"))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert_critic_trained(lines, latest_checkpoint(tmp_path))


def latest_checkpoint(out: Path) -> Path:
    return max((out / "checkpoints").glob("step_*"))


def test_a_resumed_run_continues_with_its_trained_critic(tiny_path, tmp_path):
    """Two steps and a checkpoint, then a resume to four: the resumed steps read the saved critic (a fresh one
    would value everything at exactly 0) and the critic keeps training."""
    common = [
        "controller.mode=sync",
        "trainer.checkpoint_every=1",
        *critic("shared_trunk"),
        f"model.path={tiny_path}",
        f"output_dir={tmp_path}",
    ]
    from test_modes import COMMON

    first = load_run_config(None, [*COMMON, *common, "controller.num_steps=2"])
    asyncio.run(training.train(first, console=None))
    second = load_run_config(None, [*COMMON, *common, "controller.num_steps=4", f"resume={tmp_path}"])
    summary = asyncio.run(training.train(second, console=None))
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines()]
    resumed = [line for line in lines if line["step"] > 2]
    assert [line["step"] for line in resumed] == [3, 4]
    assert all(line["train/critic/values_mean"] != 0.0 for line in resumed)
