"""Run timelines: spans written relative to the run's origin, read back by worker, busy time counted once."""

from __future__ import annotations

import pytest

from asyncrl.metrics.spans import SpanRecorder, busy_fractions, read_spans, write_spans


def test_recorded_spans_read_back_by_worker_relative_to_the_origin(tmp_path):
    now = [100.0]
    recorder = SpanRecorder(tmp_path / "timeline.jsonl", clock=lambda: now[0])
    recorder.engine_span(1, 101.0, 103.5)
    recorder.add("trainer", 102.0, 104.0, "train")
    recorder.add("trainer", 104.0, 104.0, "update")  # empty: not recorded
    now[0] = 106.0
    recorder.reward_span(0.5)
    recorder.close()
    assert read_spans(tmp_path / "timeline.jsonl") == {
        "engine1": [[1.0, 3.5, "generate"]],
        "trainer": [[2.0, 4.0, "train"]],
        "reward": [[5.5, 6.0, "reward"]],
    }


def test_written_spans_round_trip(tmp_path):
    spans = {"trainer": [[0.0, 1.0, "train"], [1.0, 1.5, "update"]], "engine0": [[0.0, 2.0, "generate"]]}
    assert read_spans(write_spans(spans, tmp_path / "t.jsonl")) == spans


def test_overlapping_spans_of_one_worker_count_once():
    spans = {"reward": [[0.0, 2.0, "reward"], [1.0, 3.0, "reward"], [5.0, 6.0, "reward"]]}
    assert busy_fractions(spans, 10.0) == {"reward": pytest.approx(0.4)}


def test_a_malformed_line_is_named(tmp_path):
    path = tmp_path / "timeline.jsonl"
    path.write_text('{"worker": "trainer", "start": 0, "end": 1, "kind": "train"}\n{"worker": "x"}\n')
    with pytest.raises(ValueError, match=r"line 2: not a timeline span"):
        read_spans(path)


def test_a_resumed_run_continues_its_timeline_after_the_last_span(tmp_path):
    path = tmp_path / "timeline.jsonl"
    first = SpanRecorder(path, clock=lambda: 10.0)
    first.add("trainer", 10.0, 12.0, "train")
    first.close()
    resumed = SpanRecorder(path, append=True, clock=lambda: 500.0)
    resumed.add("trainer", 500.0, 501.0, "train")
    resumed.close()
    assert read_spans(path) == {"trainer": [[0.0, 2.0, "train"], [2.0, 3.0, "train"]]}
