"""A resume hashes a checkpoint once, where it is loaded, never in the driver beforehand (issue 45: the driver
hashed all of an 8B checkpoint alone, ~88 s, before every resume and restart, outside any deadline), and still
never resumes a torn or corrupt checkpoint: a newer one is skipped with a warning, a named one is refused.

The driver is ``app.train.train`` with its parts replaced by a trainer facade that stops the run once its load
returns (the test is about what happens up to there): ``LocalTrainer`` on a real trainer (the inline runtime,
which hashes in this process, within the checkpoint's deadline), or ranks elsewhere that hash nothing here (the
Ray runtimes, whose ranks verify a share each). Every hash this process computes is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ray.exceptions import RayTaskError
from trainer_fixtures import tiny_qwen2

from asyncrl.app import train as training
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.runtime import actor_calls, rank_calls
from asyncrl.runtime import trainer_group as tg
from asyncrl.runtime.errors import TrainerDied
from asyncrl.runtime.inline import LocalTrainer
from asyncrl.trainer import checkpoint as ckpt
from asyncrl.trainer.trainer import Trainer


class Loaded(Exception):
    """Ends the run once the trainer's load has returned."""


def _trainer(seed: int = 0) -> Trainer:
    return Trainer(
        tiny_qwen2(seed), TrainerConfig(lr=1e-3), LossConfig(name="ppo"), AdvantageConfig(name="grpo")
    )


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory with verified checkpoints at steps 4 and 8."""
    trainer = _trainer()
    for step in (4, 8):
        trainer.step = step
        ckpt.save_checkpoint(tmp_path / "run" / "checkpoints", trainer)
    return tmp_path / "run"


def _step(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}"


@pytest.fixture
def hashed(run: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file this process hashes once ``run``'s checkpoints are written, in order."""
    seen: list[Path] = []
    original = ckpt._sha256

    def recording(path: Path, *deadline: ckpt.HashDeadline | None) -> str:
        seen.append(path)
        return original(path, *deadline)

    monkeypatch.setattr(ckpt, "_sha256", recording)
    return seen


def _files(path: Path) -> list[Path]:
    return sorted(path / name for name in ckpt.marker_hashes(path))


class StopsAfterLoad:
    """The trainer facade of the run: ``load`` (None: ranks in other processes, which hash nothing here) and
    then ``Loaded``; ``refuse`` maps a directory to the error its load raises instead."""

    def __init__(self, load: Callable[[str], Any] | None = None, refuse: dict[Path, Exception] | None = None):
        self.load, self.refuse = load, dict(refuse or {})
        self.asked: list[Path] = []

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        self.asked.append(Path(path))
        if Path(path) in self.refuse:
            raise self.refuse.pop(Path(path))
        if self.load is not None:
            self.load(path)
        raise Loaded(path)


def _train(run: Path, monkeypatch: pytest.MonkeyPatch, trainer: Any, *extra: str) -> str:
    """Run ``app.train.train`` resuming ``run`` (its output directory too) with ``trainer`` as every attempt's
    trainer, until the trainer's load has returned; the console's text."""
    overrides = ["engine.max_model_len=64", f"output_dir={run}", f"resume={run}", *extra]
    config = load_run_config(None, overrides)

    @contextlib.contextmanager
    def parts(run_config: Any) -> Iterator[Any]:
        yield SimpleNamespace(config=run_config, trainer=trainer, locations=dict)

    monkeypatch.setattr(training, "runtime_parts", parts)
    console = io.StringIO()
    with pytest.raises(Loaded):
        asyncio.run(training.train(config, console=console))
    return console.getvalue()


def test_an_inline_resume_hashes_each_file_of_the_newest_checkpoint_once(
    run: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[Path]
) -> None:
    local = LocalTrainer(_trainer(seed=1), 1, checkpoint_timeout_s=RuntimeConfig().checkpoint_timeout_s)
    try:
        _train(run, monkeypatch, StopsAfterLoad(local.load_checkpoint))
        assert local.step == 8
    finally:
        local.shutdown()
    assert sorted(hashed) == _files(_step(run, 8))  # once each, by the load; the older checkpoint not at all


def test_a_ray_resume_and_restart_hash_nothing_in_the_driver(
    run: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[Path]
) -> None:
    """The ranks verify (each a share, under the load's deadline); the driver only reads markers and listings,
    on the resume and on the restart after the trainer is lost."""
    newest = _step(run, 8)
    ranks = StopsAfterLoad(refuse={newest: TrainerDied("trainer: load_checkpoint: the trainer is lost")})
    console = _train(run, monkeypatch, ranks, "runtime.trainer_restarts=1")
    assert ranks.asked == [newest, newest]
    assert f"restart 1 from {newest}" in console
    assert hashed == []


def test_a_newer_torn_checkpoint_is_skipped_without_reading_it(
    run: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=ckpt.__name__)
    newest = _step(run, 8)
    (newest / ckpt.MARKER_FILE).unlink()
    ranks = StopsAfterLoad()
    _train(run, monkeypatch, ranks)
    assert ranks.asked == [_step(run, 4)]
    assert f"skipping checkpoint {newest}: {newest}: no COMPLETE.json" in caplog.text
    assert hashed == []


def _flip_a_byte(path: Path) -> None:
    """Corrupt ``path``'s content, its size unchanged (what no listing or size check can see)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_newer_corrupt_checkpoint_is_refused_by_its_load_and_the_previous_one_resumed(
    run: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Inline: the load hashes the newest, refuses it by name before changing the trainer, and the driver goes on
    to the previous checkpoint, the one ``latest_checkpoint`` chooses."""
    caplog.set_level(logging.WARNING, logger=ckpt.__name__)
    older, newest = _step(run, 4), _step(run, 8)
    _flip_a_byte(newest / ckpt.MODEL_DIR / "model.safetensors")
    local = LocalTrainer(_trainer(seed=1), 1, checkpoint_timeout_s=RuntimeConfig().checkpoint_timeout_s)
    try:
        facade = StopsAfterLoad(local.load_checkpoint)
        _train(run, monkeypatch, facade)
        assert (facade.asked, local.step) == ([newest, older], 4)
    finally:
        local.shutdown()
    assert f"skipping checkpoint {newest}: {newest}: model/model.safetensors does not match" in caplog.text
    assert newest / ckpt.MODEL_DIR / "model.safetensors" in hashed
    assert sorted(f for f in hashed if older in f.parents) == _files(older)  # once each
    assert ckpt.latest_checkpoint(run / "checkpoints") == older


def test_a_named_corrupt_checkpoint_fails_the_resume_by_name_and_leaves_the_trainer_untouched(
    run: Path,
) -> None:
    newest = _step(run, 8)
    _flip_a_byte(newest / ckpt.STATE_FILE)
    trainer = _trainer(seed=1)
    before = {name: t.clone() for name, t in trainer.model.state_dict().items()}
    with pytest.raises(ckpt.TornCheckpointError, match="trainer_state.pt does not match its hash"):
        ckpt.load_resume(newest, lambda path: ckpt.load_checkpoint(path, trainer))
    assert trainer.step == 0
    assert all(torch.equal(before[name], t) for name, t in trainer.model.state_dict().items())


class RankHandle:
    """A Ray trainer rank's handle: calls are refs (each its own, as Ray's) that ``RankRay.get`` answers."""

    def __init__(self) -> None:
        self.load_checkpoint = SimpleNamespace(remote=lambda path: ("load", path, object()))
        self.progress = SimpleNamespace(remote=lambda: ("progress", None, object()))


class RankRay:
    """``ray.get`` of ``RankHandle`` calls (every one ready at once): a load of a checkpoint in ``torn`` fails
    on every rank as their shares of the hashes would, delivered as Ray delivers a task's exception (a
    ``RayTaskError`` that is also an instance of the rank's ``TornCheckpointError``)."""

    def __init__(self, torn: set[Path]) -> None:
        self.torn = torn
        self.killed: list[Any] = []

    def get(self, ref: Any, timeout: float) -> Any:
        if isinstance(ref, list):
            return [self.get(one, timeout) for one in ref]
        call, path, _ = ref
        if call == "progress":
            return {"step": 4, "version": 4}
        if Path(path) in self.torn:
            cause = ckpt.TornCheckpointError(f"{path}: sharded/__1_0.distcp does not match its hash")
            raise RayTaskError("load_checkpoint", "rank 1's traceback", cause).as_instanceof_cause()
        return {"data": str(path)}

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        return refs[:num_returns], refs[num_returns:]

    def cancel(self, ref: Any) -> None:
        pass

    def kill(self, handle: Any, no_restart: bool) -> None:
        self.killed.append(handle)


def test_a_rank_refusing_the_newest_checkpoint_resumes_the_previous_one(
    run: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Through ``TrainerGroupClient``: a rank's ``TornCheckpointError`` reaches the driver as one (not as a lost
    trainer), so the driver goes on to the previous checkpoint."""
    caplog.set_level(logging.WARNING, logger=ckpt.__name__)
    older, newest = _step(run, 4), _step(run, 8)
    fake_ray = RankRay({newest})
    monkeypatch.setattr(actor_calls, "ray", fake_ray)
    monkeypatch.setattr(rank_calls, "ray", fake_ray)
    progress = [{"step": 0, "version": 0, "checkpoint_bytes": 10**6}] * 2
    group = tg.TrainerGroupClient(
        [RankHandle() for _ in range(2)], RuntimeConfig(type="local"), progress, WeightSyncConfig()
    )
    assert ckpt.load_resume(run, group.load_checkpoint) == (older, {"data": str(older)})
    assert (group.step, group.version) == (4, 4)
    assert "sharded/__1_0.distcp does not match its hash" in caplog.text
    assert fake_ray.killed == []  # the ranks agreed on the refusal: the group stays, for the older load


class SteppingClock:
    """``time`` for ``trainer.checkpoint``: each reading of the monotonic clock ``step_s`` later."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.now = step_s, 0.0

    def monotonic(self) -> float:
        self.now += self.step_s
        return self.now


@pytest.mark.parametrize("step_s", [0.0, 1000.0])
def test_the_inline_load_hashes_within_the_checkpoint_deadline_of_its_bytes(
    run: Path, monkeypatch: pytest.MonkeyPatch, step_s: float
) -> None:
    """The deadline is ``runtime.checkpoint_timeout_s`` of the checkpoint's bytes on disk; a clock that stands
    still never reaches it, one that passes it between two blocks fails the load by name, before it changes
    the trainer."""
    path = _step(run, 8)
    nbytes = sum(f.stat().st_size for f in _files(path))
    runtime = RuntimeConfig(checkpoint_timeout_floor_s=5.0, checkpoint_timeout_gbps=1.0)
    asked: list[int] = []

    def timeout_s(n: int) -> float:
        asked.append(n)
        return runtime.checkpoint_timeout_s(n)

    monkeypatch.setattr(ckpt, "time", SteppingClock(step_s))
    local = LocalTrainer(_trainer(seed=1), 1, checkpoint_timeout_s=timeout_s)
    try:
        if step_s == 0.0:
            local.load_checkpoint(path)
            assert local.step == 8
        else:
            deadline = f"{runtime.checkpoint_timeout_s(nbytes):.1f}"
            why = re.escape(f"verifying {path} ({nbytes} bytes): past its deadline of {deadline} s, at ")
            with pytest.raises(ckpt.CheckpointTimeout, match=why):
                local.load_checkpoint(path)
            assert local.step == 0
    finally:
        local.shutdown()
    assert asked == [nbytes]
