"""A save of the step a trainer's state was last saved or loaded as rewrites only ``extra.json``.

The DAPO recipes save every 20 steps for 300 steps: the periodic save of step 300 and the run's final one
(``app.train._end_run``) wrote the same ~115 GB twice (1-5 min; on SIGTERM far past a 30 s grace period). Now
the second hard-links the first's files and writes the fresh ``extra``; a train step in between (or a state
never saved there) writes everything. One process and two FSDP2 ranks alike."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer import checkpoint as ckpt
from asyncrl.trainer.checkpoint import load_checkpoint, save_checkpoint, verify_checkpoint
from asyncrl.trainer.distributed.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer


def _trainer(parallel: Parallelism | None = None, seed: int = 0) -> Trainer:
    return Trainer(
        tiny_qwen2(seed),
        TrainerConfig(lr=1e-3, warmup_steps=2),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=parallel or SingleProcess(),
    )


def _groups(step: int):
    return with_model_logprobs(
        random_groups(num_groups=2, group_size=4, seed=10 + step), tiny_qwen2(), noise=0.3
    )


def _inodes(path: Path) -> dict[str, int]:
    """Every file's inode but ``extra.json``'s and the marker's (rewritten by every save)."""
    skip = {ckpt.EXTRA_FILE, ckpt.MARKER_FILE}
    return {f: os.stat(path / f).st_ino for f in ckpt.checkpoint_files(path) if f not in skip}


@pytest.fixture
def state_writes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The trainer state files written (``torch.save`` to ``trainer_state.pt``): one per full save."""
    written: list[Path] = []
    save = torch.save

    def counting(obj, f, *args, **kwargs):
        if Path(f).name == ckpt.STATE_FILE:
            written.append(Path(f))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", counting)
    return written


def test_saving_the_same_step_again_writes_only_extra(tmp_path, state_writes):
    trainer = _trainer()
    trainer.train_step(_groups(0), policy_version=0)
    first = save_checkpoint(tmp_path, trainer, extra={"buffered": 1})
    inodes = _inodes(first)
    again = save_checkpoint(tmp_path, trainer, extra={"buffered": 2}, keep_last=1)

    assert again == first and len(state_writes) == 1
    assert _inodes(again) == inodes  # the same files, linked
    verify_checkpoint(again)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    resumed = _trainer(seed=7)
    assert load_checkpoint(again, resumed) == {"buffered": 2}
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name

    resumed_inodes = _inodes(again)
    save_checkpoint(tmp_path, resumed, extra={"buffered": 3})  # loaded from there: the same state
    assert len(state_writes) == 1 and _inodes(again) == resumed_inodes


def test_a_train_step_or_another_root_writes_everything(tmp_path, state_writes):
    trainer = _trainer()
    trainer.train_step(_groups(0), policy_version=0)
    save_checkpoint(tmp_path / "a", trainer)
    save_checkpoint(tmp_path / "b", trainer)  # not saved there
    trainer.train_step(_groups(1), policy_version=1)
    save_checkpoint(tmp_path / "a", trainer)
    trainer.step = 1  # its state is saved as step 2, not as step 1
    save_checkpoint(tmp_path / "a", trainer)
    assert len(state_writes) == 4


def test_a_torn_saved_checkpoint_is_written_whole_again(tmp_path, state_writes):
    trainer = _trainer()
    first = save_checkpoint(tmp_path, trainer, extra={"buffered": 1})
    (first / ckpt.STATE_FILE).unlink()
    again = save_checkpoint(tmp_path, trainer, extra={"buffered": 2})
    assert len(state_writes) == 2
    verify_checkpoint(again)


def _save_twice(root: str) -> dict | None:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    trainer = _trainer(FullyShardedParallel("cpu"))
    trainer.train_step(_groups(0), policy_version=0)
    path = save_sharded_checkpoint(
        root, trainer, extra={"buffered": 1} if trainer.parallel.rank == 0 else None
    )
    inodes = _inodes(path) if trainer.parallel.rank == 0 else None
    again = save_sharded_checkpoint(
        root, trainer, extra={"buffered": 2} if trainer.parallel.rank == 0 else None
    )
    if trainer.parallel.rank != 0:
        return None
    return {"path": str(again), "same_path": again == path, "same_files": _inodes(again) == inodes}


def _load(path: str) -> dict:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    trainer = _trainer(FullyShardedParallel("cpu"), seed=7)
    return {
        "rank": trainer.parallel.rank,
        "extra": load_sharded_checkpoint(path, trainer),
        "step": trainer.step,
    }


def test_two_ranks_saving_the_same_step_again_write_only_extra_and_only_rank_0_reads_it(tmp_path):
    saved = run_ranks(_save_twice, 2, str(tmp_path))[0]
    assert saved["same_path"] and saved["same_files"], saved
    path = Path(saved["path"])
    verify_checkpoint(path)
    assert json.loads((path / ckpt.EXTRA_FILE).read_text()) == {"buffered": 2}
    loaded = run_ranks(_load, 2, str(path))
    assert [(x["rank"], x["extra"], x["step"]) for x in loaded] == [(0, {"buffered": 2}, 1), (1, {}, 1)]
