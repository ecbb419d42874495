"""Checkpoints: resuming reproduces an uninterrupted run exactly; saves are atomic; latest/prune bookkeeping."""

from __future__ import annotations

import json
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


def test_extra_is_written_compact_and_an_indented_one_still_loads(tmp_path):
    """``extra`` holds every buffered group's tokens: ``indent=1`` made it ~67 B a token and used ``json``'s
    pure-Python encoder (~12 s for 370 MB on rank 0)."""
    trainer = _trainer()
    extra = {"buffered_groups": [{"tokens": list(range(5))}], "consumed": ["g0"]}
    path = save_checkpoint(tmp_path / "new", trainer, extra=extra)
    assert (
        path / ckpt.EXTRA_FILE
    ).read_text() == '{"buffered_groups":[{"tokens":[0,1,2,3,4]}],"consumed":["g0"]}'

    old = save_checkpoint(tmp_path / "old", trainer)
    (old / ckpt.EXTRA_FILE).write_text(json.dumps(extra, indent=1))  # as older checkpoints hold it
    (old / ckpt.MARKER_FILE).unlink()
    ckpt.write_marker(old)
    assert load_checkpoint(old, _trainer()) == extra


class FakeCuda:
    """``torch.cuda`` of a process that sees ``visible`` GPUs, each with its own RNG state."""

    def __init__(self, visible: int, current: int = 0) -> None:
        self.visible, self.current = visible, current
        self.states = [torch.full((4,), i, dtype=torch.uint8) for i in range(visible)]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self.set_all)

    def get(self, device: int | str = "cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set(self, state: torch.Tensor, device: int | str = "cuda") -> None:
        self.states[self._index(device)] = state.clone()

    def set_all(self, states: list[torch.Tensor]) -> None:
        for index, state in enumerate(states):
            self.set(state, index)

    def _index(self, device: int | str) -> int:
        index = self.current if device == "cuda" else int(device)
        if index >= self.visible:
            raise IndexError(f"list index {index} out of range: {self.visible} GPUs visible")
        return index


def test_rng_state_holds_the_current_devices_cuda_state_only(monkeypatch):
    """An inline trainer's process sees every GPU of its node: it saved eight CUDA states, and a resume that
    saw fewer GPUs failed on them (``IndexError``)."""
    eight = FakeCuda(visible=8, current=3)
    eight.install(monkeypatch)
    state = ckpt.rng_state()
    assert [s.tolist() for s in state["cuda"]] == [[3, 3, 3, 3]]

    two = FakeCuda(visible=2, current=1)
    two.install(monkeypatch)
    ckpt.set_rng_state(state)
    assert two.states[1].tolist() == [3, 3, 3, 3] and two.states[0].tolist() == [0, 0, 0, 0]


def test_an_older_checkpoints_every_device_list_restores_the_current_devices_state(monkeypatch):
    eight = FakeCuda(visible=8)
    saved = {**ckpt.rng_state(), "cuda": [s.clone() for s in eight.states]}  # as older checkpoints hold it
    two = FakeCuda(visible=2, current=1)
    two.install(monkeypatch)
    ckpt.set_rng_state(saved)
    assert two.states[1].tolist() == [1, 1, 1, 1] and two.states[0].tolist() == [0, 0, 0, 0]
    one = FakeCuda(visible=8, current=5)
    one.install(monkeypatch)
    ckpt.set_rng_state({**saved, "cuda": saved["cuda"][:2]})  # saw fewer GPUs than this device's index
    assert one.states[5].tolist() == [0, 0, 0, 0]


def test_the_skipped_update_count_is_checkpointed(tmp_path):
    """``trainer.max_consecutive_skipped_updates`` counts across a resume, as in the uninterrupted run; a
    checkpoint without the count (older) resumes at 0."""
    trainer = _trainer()
    trainer.skipped_in_a_row = 2
    path = save_checkpoint(tmp_path, trainer)
    resumed = _trainer()
    load_checkpoint(path, resumed)
    assert resumed.skipped_in_a_row == 2

    state = torch.load(path / ckpt.STATE_FILE, weights_only=True)
    del state["skipped_in_a_row"]
    resumed.load_state_dict(state)
    assert resumed.skipped_in_a_row == 0
