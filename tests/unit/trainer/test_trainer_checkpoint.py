"""Checkpoints: resuming reproduces an uninterrupted run exactly; saves are atomic; latest/prune bookkeeping."""

from __future__ import annotations

import logging

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer import checkpoint as ckpt
from asyncrl.trainer.checkpoint import (
    checkpoint_due,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from asyncrl.trainer.trainer import Trainer

CONFIG = TrainerConfig(lr=1e-3, warmup_steps=2, num_mini_batches=2, weight_decay=0.01)


def _trainer(seed: int = 0) -> Trainer:
    return Trainer(tiny_qwen2(seed), CONFIG, LossConfig(name="ppo"), AdvantageConfig(name="grpo"))


def _batches():
    reference = tiny_qwen2()
    return [with_model_logprobs(random_groups(num_groups=2, seed=s), reference) for s in (10, 11)]


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    first, second = _batches()
    uninterrupted = _trainer()
    uninterrupted.train_step(first, policy_version=0)
    uninterrupted.train_step(second, policy_version=1)

    interrupted = _trainer()
    interrupted.train_step(first, policy_version=0)
    path = save_checkpoint(tmp_path, interrupted, extra={"consumed": ["g0", "g1"], "epoch": 0})
    resumed = _trainer(seed=123)  # different initial weights: everything must come from the checkpoint
    assert load_checkpoint(path, resumed) == {"consumed": ["g0", "g1"], "epoch": 0}
    assert (resumed.step, resumed.version) == (1, 1)
    resumed.train_step(second, policy_version=1)

    for (name, expected), actual in zip(
        uninterrupted.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(expected, actual), name
    assert resumed.scheduler.get_last_lr() == uninterrupted.scheduler.get_last_lr()


def test_rng_states_are_restored(tmp_path):
    trainer = _trainer()
    path = save_checkpoint(tmp_path, trainer)
    expected = torch.rand(3)
    torch.rand(5)
    load_checkpoint(path, trainer)
    assert torch.equal(torch.rand(3), expected)


def test_a_failed_save_leaves_no_checkpoint(tmp_path, monkeypatch):
    trainer = _trainer()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, trainer)
    assert latest_checkpoint(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_latest_and_prune(tmp_path):
    trainer = _trainer()
    assert latest_checkpoint(tmp_path / "missing") is None
    for step in (3, 12, 7):
        trainer.step = step
        save_checkpoint(tmp_path, trainer)
    (tmp_path / "step_00000099").mkdir()  # incomplete: no trainer state
    (tmp_path / ".tmp-step_00000100-x").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000012"
    save_checkpoint(tmp_path, trainer, keep_last=2)  # step 12 again: replaced in place, then pruned
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [
        "step_00000007",
        "step_00000012",
        "step_00000099",
    ]
    assert prune_checkpoints(tmp_path, keep_last=1) == [tmp_path / "step_00000007"]


def test_loading_into_a_different_model_fails(tmp_path):
    path = save_checkpoint(tmp_path, _trainer())
    trainer = _trainer()
    trainer.model.register_parameter("extra", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(ValueError, match=r"missing \['extra'\]"):
        load_checkpoint(path, trainer)
    with pytest.raises(FileNotFoundError, match="not an asyncrl checkpoint"):
        load_checkpoint(tmp_path, trainer)


def test_checkpoint_due():
    assert [s for s in range(7) if checkpoint_due(s, 3)] == [3, 6]
    assert not any(checkpoint_due(s, 0) for s in range(5))


@pytest.mark.parametrize(
    ("tear", "why"),
    [
        (lambda path: (path / ckpt.MARKER_FILE).unlink(), "no COMPLETE.json"),
        (lambda path: (path / ckpt.EXTRA_FILE).write_text('{"x": 1}'), "extra.json does not match its hash"),
        (
            lambda path: _truncate(path / ckpt.MODEL_DIR / "model.safetensors"),
            "model.safetensors does not match",
        ),
        (lambda path: _flip_a_byte(path / ckpt.STATE_FILE), "trainer_state.pt does not match"),  # same size
        (lambda path: (path / ckpt.STATE_FILE).rename(path / "moved.pt"), "missing \\['trainer_state.pt'\\]"),
    ],
)
def test_a_torn_checkpoint_is_never_loaded_and_the_newest_verified_one_is(tmp_path, tear, why, caplog):
    caplog.set_level(logging.WARNING, logger=ckpt.__name__)
    trainer = _trainer()
    for step in (4, 8):
        trainer.step = step
        save_checkpoint(tmp_path, trainer)
    newest = tmp_path / "step_00000008"
    tear(newest)
    with pytest.raises(ckpt.TornCheckpointError, match=why):
        ckpt.verify_checkpoint(newest)
    if (newest / ckpt.STATE_FILE).is_file():
        with pytest.raises(ckpt.TornCheckpointError, match=why):
            load_checkpoint(newest, _trainer())
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000004"
    assert "skipping checkpoint" in caplog.text and why.replace("\\", "") in caplog.text
    assert ckpt.resolve_resume_path(tmp_path) == tmp_path / "step_00000004"
    resumed = _trainer(seed=1)  # a resume: the load verifies, the newest refused by it or before it
    found, _ = ckpt.load_resume(tmp_path, lambda path: load_checkpoint(path, resumed))
    assert (found, resumed.step) == (tmp_path / "step_00000004", 4)


def test_resume_path_accepts_a_run_dir_or_a_step_dir_and_names_a_missing_one(tmp_path):
    path = save_checkpoint(tmp_path / "run" / "checkpoints", _trainer())
    assert ckpt.resolve_resume_path(tmp_path / "run") == path
    assert ckpt.resolve_resume_path(path) == path
    with pytest.raises(FileNotFoundError, match="no verified checkpoint"):
        ckpt.resolve_resume_path(tmp_path / "elsewhere")


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
