"""``asyncrl train``: the packaged default example loads, overrides without a file apply to it, and a resume
without a file continues with the resumed run's own config."""

from __future__ import annotations

import argparse
import contextlib
import json

from asyncrl.cli import train
from asyncrl.config.base import to_dict
from asyncrl.config.run import load_run_config


def test_default_example_is_a_valid_async_config() -> None:
    config = load_run_config(train.DEFAULT_EXAMPLE)
    assert config.controller.mode == "async"
    assert config.buffer.async_ratio == 2.0
    assert config.model.path == ""  # the embedded tiny-count checkpoint


def test_overrides_without_a_file_apply_to_the_default_example(monkeypatch) -> None:
    seen: list[list[str]] = []

    def fake_config(args: argparse.Namespace):
        seen.append(list(args.config_args))
        raise ValueError("stop before training")

    monkeypatch.setattr(train, "run_config_from_args", fake_config)
    for given in ([], ["trainer.lr=1e-3"]):
        with contextlib.suppress(ValueError):
            train.run(argparse.Namespace(config_args=list(given)))
    assert seen == [[str(train.DEFAULT_EXAMPLE)], [str(train.DEFAULT_EXAMPLE), "trainer.lr=1e-3"]]


def test_summary_prints_measured_phase_times_and_no_sync_estimate() -> None:
    from asyncrl.app.train import TrainingSummary

    summary = TrainingSummary(
        mode="async",
        steps=3,
        wall_s=10.0,
        train_wall_s=8.0,
        trained_samples=96,
        phase_busy_s={"generation": 5.0, "train": 4.0, "weight_sync": 0.5},
        eval_before={"eval/reward_mean": 0.1},
        eval_after={"eval/reward_mean": 0.3},
        checkpoint="ckpt",
        metrics_path="metrics.jsonl",
    )
    text = train.format_summary(summary)
    assert "generation 5.0s, train 4.0s, weight_sync 0.5s" in text
    assert "sync run" not in text and "would take" not in text


def test_resume_without_a_file_continues_with_the_runs_own_config(tmp_path, monkeypatch) -> None:
    """``asyncrl train resume=RUN`` resumes RUN's settings (its ``config.json``), overrides on top; the default
    example would otherwise train another task from that run's checkpoint. A named config still wins."""
    from asyncrl.app import train as app_train

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    started = load_run_config(None, ["model.path=my-model", "controller.mode=sync", f"output_dir={run}"])
    (run / "config.json").write_text(json.dumps(to_dict(started)))
    seen: list = []

    async def fake_train(config, stop=None):
        seen.append(config)
        raise ValueError("stop before training")

    monkeypatch.setattr(app_train, "train", fake_train)
    with contextlib.suppress(ValueError):
        train.run(argparse.Namespace(config_args=[f"resume={run}", "trainer.lr=1e-3"]))
    ((config,),) = [seen]
    assert (config.model.path, config.controller.mode, config.resume) == ("my-model", "sync", str(run))
    assert config.trainer.lr == 1e-3
    assert train.resumed_run([str(train.DEFAULT_EXAMPLE), f"resume={run}"]) is None  # a named file wins
    assert train.resumed_run(["trainer.lr=1e-3"]) is None
