"""``asyncrl report`` on a short real run and a simulated one: series, timelines and one HTML page."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from asyncrl.app import train as training
from asyncrl.cli.main import main
from asyncrl.config.run import load_run_config
from asyncrl.metrics.report import load_run

REAL_RUN = (
    "controller.num_steps=3",
    "controller.eval_prompts=8",
    "task.num_eval=8",
    "rollout.rollout_batch_size=2",
    "rollout.num_return_sequences=4",
    "rollout.max_new_tokens=16",
    "model.device=cpu",
    "metrics.trackers=[console,jsonl,tensorboard]",
)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("real") / "async-run"
    config = load_run_config(None, [*REAL_RUN, f"output_dir={out}"])
    asyncio.run(training.train(config, console=None))
    return out


@pytest.fixture(scope="module")
def simulated_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "sim-run"
    config = Path(__file__).parents[2] / "asyncrl" / "examples" / "sim" / "queue_vs_batch.yaml"
    assert (
        main(
            [
                "simulate",
                str(config),
                "controller.num_steps=3",
                "steady_state.enabled=false",
                f"output_dir={out}",
            ]
        )
        == 0
    )
    return out


def test_a_real_run_records_its_timeline_and_every_series(real_run):
    run = load_run(real_run)
    assert run.kind == "real" and run.steps == [1, 2, 3]
    assert run.reward is not None and len(run.reward) == 3
    assert run.length_mean is not None and run.length_p99 is not None
    assert sum(run.staleness.values()) == 3 * 2 * 4
    assert run.eval_before is not None and run.eval_after is not None
    assert run.spans is not None
    kinds = {(worker, kind) for worker, items in run.spans.items() for _, _, kind in items}
    assert {
        ("trainer", "train"),
        ("trainer", "update"),
        ("engine0", "generate"),
        ("reward", "reward"),
    } <= kinds
    trainer = run.spans["trainer"]
    assert len([s for s in trainer if s[2] == "train"]) == 3
    assert all(end > start >= 0 for start, end, _ in trainer)
    assert set(run.idle_by_role()) == {"trainer", "engines", "reward"}
    assert list((real_run / "tensorboard").glob("events.out.tfevents.*"))


def test_every_step_records_its_weight_transfer_in_every_tracker(real_run):
    """``weight_sync/bytes`` is what the in-process transport cloned: the model's bytes, the tied matrix once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from asyncrl.models.loading import load_model_and_tokenizer, state_dict_for_sync
    from asyncrl.weight_sync.protocol import named_nbytes

    model, _ = load_model_and_tokenizer("", "float32", "cpu")
    expected = named_nbytes(state_dict_for_sync(model))
    sync = load_run(real_run).weight_sync
    assert sync["weight_sync/bytes"] == [float(expected)] * 3
    assert all(s > 0 for s in sync["weight_sync/seconds"])
    for seconds, speed in zip(sync["weight_sync/seconds"], sync["weight_sync/gb_per_s"], strict=True):
        assert speed == pytest.approx(expected / seconds / 1e9)
    events = EventAccumulator(str(real_run / "tensorboard")).Reload()
    assert {"weight_sync/seconds", "weight_sync/bytes", "weight_sync/gb_per_s"} <= set(
        events.Tags()["scalars"]
    )


def test_report_overlays_real_and_simulated_runs_in_one_self_contained_page(
    real_run, simulated_run, tmp_path
):
    out = tmp_path / "report"
    assert main(["report", str(real_run), str(simulated_run), "--out", str(out)]) == 0
    expected = {
        "reward.png",
        "length.png",
        "staleness.png",
        "buffer.png",
        "weight_sync.png",
        "timelines.png",
        "timeline_0.png",
        "timeline_1.png",
    }
    assert expected <= {p.name for p in out.glob("*.png")}
    page = (out / "index.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{100,}"', page)) == len(expected)
    assert "async-run" in page and "sim-run" in page and "simulated" in page
    simulated = load_run(simulated_run)
    assert simulated.kind == "simulated" and simulated.reward is None and simulated.steps == [1, 2, 3]
    assert "trainer" in simulated.spans and any(w.startswith("engine") for w in simulated.spans)


def test_report_names_a_directory_that_is_not_a_run(tmp_path):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
