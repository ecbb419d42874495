"""What a killed save leaves under the checkpoint root goes at the next save, and a step's only complete copy
never does.

A save killed midway (rank 0 killed by ``rank_calls`` when another rank failed the save, a SIGKILL, a lost
node) never reaches its ``finally``: its staging directory (``.tmp-step_*``, up to ~115 GB for Qwen3-8B) stayed
for good, as did a retired copy (``.old-step_*``) of a step saved again. The disk plan counts the kept
checkpoints and the one being written only. A save killed between ``_move_into_place``'s two renames leaves
the retired copy as its step's only one: it is kept, and loaders take it for that step."""

from __future__ import annotations

import shutil

from trainer_fixtures import tiny_qwen2

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer import checkpoint as ckpt
from asyncrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, load_resume, save_checkpoint
from asyncrl.trainer.trainer import Trainer


def _trainer(step: int) -> Trainer:
    trainer = Trainer(
        tiny_qwen2(), TrainerConfig(lr=1e-3), LossConfig(name="ppo"), AdvantageConfig(name="grpo")
    )
    trainer.step = trainer.version = step
    return trainer


def _killed_staging(root, step: int, complete: bool):
    """A staging directory as a save killed before its rename leaves it (with its marker or not)."""
    path = root / f".tmp-step_{step:08d}-killed"
    shutil.copytree(save_checkpoint(root / "elsewhere", _trainer(step)), path)
    if not complete:
        (path / ckpt.MARKER_FILE).unlink()
    return path


def test_the_next_save_deletes_a_killed_saves_staging_directories(tmp_path):
    torn = _killed_staging(tmp_path, 3, complete=False)
    unrenamed = _killed_staging(tmp_path, 4, complete=True)  # hashed, never renamed: not committed
    save_checkpoint(tmp_path, _trainer(2))
    assert not torn.exists() and not unrenamed.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "step_00000002"]


def test_the_next_save_deletes_a_retired_copy_once_its_step_is_in_place(tmp_path):
    """``_move_into_place`` killed after both renames, during the retired copy's ``rmtree``."""
    placed = save_checkpoint(tmp_path, _trainer(5))
    retired = tmp_path / ".old-step_00000005-4242"
    shutil.copytree(placed, retired)
    (retired / ckpt.STATE_FILE).unlink()  # partly deleted
    save_checkpoint(tmp_path, _trainer(6))
    assert not retired.exists() and placed.is_dir()


def test_a_retired_copy_that_is_its_steps_only_copy_is_kept_and_loaded(tmp_path):
    """``_move_into_place`` killed between its renames: ``step_5`` retired, the new save never in place."""
    placed = save_checkpoint(tmp_path, _trainer(5), extra={"at": 5})
    retired = tmp_path / ".old-step_00000005-4242"
    placed.rename(retired)
    _killed_staging(tmp_path, 5, complete=True)

    assert latest_checkpoint(tmp_path) == retired
    path, extra = load_resume(tmp_path, lambda p: load_checkpoint(p, _trainer(0)))
    assert (path, extra) == (retired, {"at": 5})

    save_checkpoint(tmp_path, _trainer(3))  # an older step (a run resumed before the kill): kept
    assert retired.is_dir() and latest_checkpoint(tmp_path) == retired
    assert not list(tmp_path.glob(".tmp-*"))

    save_checkpoint(tmp_path, _trainer(5))  # step 5 in place again: the retired copy goes at the next save
    assert retired.is_dir()
    save_checkpoint(tmp_path, _trainer(6), keep_last=3)
    assert not retired.exists()
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [
        "step_00000003",
        "step_00000005",
        "step_00000006",
    ]


def test_pruning_counts_a_retired_copy_for_its_step(tmp_path):
    save_checkpoint(tmp_path, _trainer(5)).rename(tmp_path / ".old-step_00000005-4242")
    save_checkpoint(tmp_path, _trainer(6))
    save_checkpoint(tmp_path, _trainer(7), keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000006", "step_00000007"]
