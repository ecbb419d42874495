"""Trackers: TensorBoard event files and W&B offline runs hold the step metrics; bad tracker configs are named."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from asyncrl.config.metrics import MetricsConfig
from asyncrl.config.run import load_run_config
from asyncrl.metrics.tracker import MetricsTracker, read_metrics
from asyncrl.metrics.trackers import flatten

STEPS = [{"reward/mean": 0.25, "samples_per_s": 10.0}, {"reward/mean": 0.5, "samples_per_s": 12.0}]
SUMMARY = {"steps": 2, "eval_after": {"eval/reward_mean": 0.75}, "checkpoint": "ckpt"}


def log_run(path: Path, trackers: tuple[str, ...], console: io.StringIO | None = None) -> None:
    tracker = MetricsTracker(
        path / "metrics.jsonl", total_steps=2, console=console, config=MetricsConfig(trackers=trackers)
    )
    tracker.log_config({"seed": 3, "trainer": {"lr": 1e-4}})
    for step, metrics in enumerate(STEPS, start=1):
        tracker.log(step, metrics)
    tracker.log_summary(SUMMARY)
    tracker.close()


def test_jsonl_is_the_record_and_console_prints_plain_lines_off_a_terminal(tmp_path):
    console = io.StringIO()
    log_run(tmp_path, ("console", "jsonl"), console)
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": i + 1, **m} for i, m in enumerate(STEPS)]
    lines = console.getvalue().splitlines()
    assert lines[0].startswith("[step 1/2] reward=0.25  samples_per_s=10  eta=")
    assert lines[1] == "[step 2/2] reward=0.5  samples_per_s=12"


def test_tensorboard_event_files_hold_every_step_metric_and_the_summary(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_run(tmp_path, ("jsonl", "tensorboard"))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]
    assert [e.value for e in events.Scalars("samples_per_s")] == [10.0, 12.0]
    assert events.Scalars("summary/eval_after/eval/reward_mean")[0].value == 0.75
    assert set(events.Tags()["tensors"]) >= {"config/text_summary", "summary/text_summary"}


def test_wandb_offline_writes_its_run_directory_with_the_metrics(tmp_path):
    pytest.importorskip("wandb")
    log_run(tmp_path, ("jsonl", "wandb"))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    (record_file,) = runs[0].glob("run-*.wandb")
    keys = (b"reward/mean", b"samples_per_s", b"eval_after/eval/reward_mean", b"trainer")
    deadline = time.monotonic() + 30  # wandb's service process may still be writing after finish() returns
    while not all(key in record_file.read_bytes() for key in keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    records = record_file.read_bytes()  # protobuf records whose history/summary keys are plain strings
    for key in keys:
        assert key in records, key


def test_flatten_joins_nested_keys():
    assert flatten(SUMMARY) == {"steps": 2, "eval_after/eval/reward_mean": 0.75, "checkpoint": "ckpt"}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("metrics.trackers=[console,tensorbored]", r"tensorbored"),
        ("metrics.trackers=[console]", r"must include 'jsonl'"),
        ("metrics.trackers=[jsonl,jsonl]", r"twice"),
        ("metrics.progress=spinner", r"metrics.progress"),
    ],
)
def test_bad_tracker_settings_are_named_errors(override, message):
    with pytest.raises(ValueError, match=message):
        load_run_config(None, [override])


def test_console_shows_fault_counters_once_they_are_above_zero(tmp_path):
    console = io.StringIO()
    tracker = MetricsTracker(
        tmp_path / "metrics.jsonl",
        total_steps=2,
        console=console,
        config=MetricsConfig(trackers=("console", "jsonl")),
    )
    quiet = {"reward/mean": 0.5, "recovery/engine_restarts": 0.0, "rewards/timed_out": 0.0}
    tracker.log(1, quiet)
    tracker.log(2, {**quiet, "recovery/engine_restarts": 1.0, "recovery/reclaimed_requests": 3.0})
    tracker.close()
    lines = console.getvalue().splitlines()
    assert "engine_restarts" not in lines[0] and "reward_timeouts" not in lines[0]
    assert lines[1] == "[step 2/2] reward=0.5  engine_restarts=1  reclaimed=3"
