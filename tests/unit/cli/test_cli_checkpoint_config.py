"""``asyncrl export`` and ``asyncrl eval --checkpoint`` read the config of the run that wrote the checkpoint:
``key=value`` overrides alone apply on top of it (the weights keep the base ``model.path`` they trained from),
a named CONFIG.yaml replaces it, and a checkpoint with no run config above it needs ``model.path`` named."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.app import evaluate
from asyncrl.cli.args import checkpoint_run_config
from asyncrl.cli.main import main
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.base import to_dict
from asyncrl.config.run import load_run_config
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import save_tiny
from asyncrl.models.tiny import build_tiny
from asyncrl.trainer import checkpoint as ckpt
from asyncrl.trainer.checkpoint import save_checkpoint
from asyncrl.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """(run directory, its base model directory, the weights its checkpoint holds): a run whose model.path is a
    tiny model of its own (not the embedded default), with one checkpoint of weights moved off that base."""
    root = tmp_path_factory.mktemp("run")
    model, tokenizer = build_tiny(
        sample_texts(200), vocab_size=300, hidden_size=32, num_heads=2, num_layers=1
    )
    base = save_tiny(model, tokenizer, root / "base")
    run = root / "run"
    config = load_run_config(None, [f"model.path={base}", "model.dtype=float32", f"output_dir={run}"])
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(config)))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
    trainer = Trainer(model, TrainerConfig(), LossConfig(name="ppo"), AdvantageConfig(name="grpo"))
    save_checkpoint(run / "checkpoints", trainer)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    return run, base, weights


def test_export_with_an_override_keeps_the_runs_model_path(trained_run, tmp_path) -> None:
    run, _, weights = trained_run
    assert main(["export", str(run), str(tmp_path / "out"), "model.dtype=bfloat16"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True, dtype="auto")
    assert exported.config.hidden_size == 32  # the run's own base, not the embedded default
    state = dict(exported.named_parameters())
    for name, expected in weights.items():
        assert state[name].dtype == torch.bfloat16  # the override applied too
        assert torch.equal(state[name], expected.to(torch.bfloat16)), name


def test_eval_of_a_checkpoint_with_overrides_keeps_the_runs_model_path(trained_run, monkeypatch) -> None:
    run, base, _ = trained_run
    seen = []

    async def fake_evaluate(config, checkpoint):
        seen.append((config, checkpoint))
        return {}

    monkeypatch.setattr(evaluate, "evaluate_model", fake_evaluate)
    step = str(next((run / "checkpoints").iterdir()))
    assert main(["eval", "controller.eval_prompts=3", "--checkpoint", step]) == 0
    ((config, checkpoint),) = seen
    assert (config.model.path, config.controller.eval_prompts, checkpoint) == (str(base), 3, step)


class Served(Exception):
    """Ends ``evaluate_model`` once the checkpoint's weights are in the model it would serve."""


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """Every checkpoint file this process hashes from now on."""
    seen: list[Path] = []
    original = ckpt._sha256

    def recording(path: Path, *deadline) -> str:
        seen.append(path)
        return original(path, *deadline)

    monkeypatch.setattr(ckpt, "_sha256", recording)
    return seen


def _step_files(run: Path) -> list[Path]:
    step = next((run / "checkpoints").iterdir())
    return sorted(step / name for name in ckpt.marker_hashes(step))


def test_export_and_eval_hash_every_file_of_the_checkpoint_once(trained_run, tmp_path, hashed, monkeypatch):
    """They read the weights without ``load_checkpoint``, so they verify first (``resolve_resume_path``), once."""
    run, _, _ = trained_run
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert sorted(hashed) == _step_files(run)
    hashed.clear()

    def make_engine(*args, **kwargs):
        raise Served

    monkeypatch.setattr(evaluate, "make_engine", make_engine)
    config = checkpoint_run_config(_args(), str(run))
    with pytest.raises(Served):
        asyncio.run(evaluate.evaluate_model(config, str(run)))
    assert sorted(hashed) == _step_files(run)


def test_export_refuses_a_checkpoint_whose_content_changed_by_name(trained_run, tmp_path, capsys) -> None:
    run, _, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    step = next((copy / "checkpoints").iterdir())
    weights = step / ckpt.MODEL_DIR / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the size unchanged
    weights.write_bytes(bytes(data))
    assert main(["export", str(step), str(tmp_path / "out")]) != 0
    assert "model/model.safetensors does not match its hash" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _args(*config_args: str) -> argparse.Namespace:
    return argparse.Namespace(config_args=list(config_args))


def test_a_named_config_file_replaces_the_runs_config(trained_run, tmp_path) -> None:
    run, _, _ = trained_run
    named = tmp_path / "other.yaml"
    named.write_text("model:\n  path: elsewhere\n")
    config = checkpoint_run_config(_args(str(named), "model.dtype=bfloat16"), str(run))
    assert (config.model.path, config.model.dtype) == ("elsewhere", "bfloat16")


def test_a_checkpoint_without_its_run_config_needs_model_path_named(trained_run, tmp_path) -> None:
    run, _, _ = trained_run
    bare = tmp_path / "bare"
    shutil.copytree(next((run / "checkpoints").iterdir()), bare)
    with pytest.raises(FileNotFoundError, match="no run config.json above"):
        checkpoint_run_config(_args("model.dtype=bfloat16"), str(bare))
    assert checkpoint_run_config(_args("model.path=mine"), str(bare)).model.path == "mine"
