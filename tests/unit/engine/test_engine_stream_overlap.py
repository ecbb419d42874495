"""The colocate kit's stream-overlap measurement (``scripts/gpu_checks/stream_overlap.py``), on synthetic
profiler traces: it runs only on a GPU, so its arithmetic is checked here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_checks" / "stream_overlap.py"
spec = importlib.util.spec_from_file_location("stream_overlap", SCRIPT)
stream_overlap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stream_overlap)


def kernel(stream: int, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_overlap_counts_only_time_when_two_streams_run_at_once() -> None:
    trace = {
        "traceEvents": [
            kernel(7, 0, 10),
            kernel(7, 5, 10),  # overlaps its own stream: one busy span 0..15, never counted as overlap
            kernel(13, 12, 10),  # 12..15 beside stream 7
            kernel(13, 30, 5),
            kernel(7, 32, 1),  # 32..33 beside stream 13
            {"cat": "cpu_op", "ts": 0, "dur": 100},  # not a kernel
        ]
    }
    report = stream_overlap.overlap_report(trace)
    assert report["streams_busy_s"] == pytest.approx({"7": 16e-6, "13": 15e-6})
    assert report["overlap_s"] == pytest.approx(4e-6) and report["overlapped"]
    assert report["window_s"] == pytest.approx(35e-6)


def test_one_stream_or_no_kernels_never_overlaps() -> None:
    serial = stream_overlap.overlap_report({"traceEvents": [kernel(7, 0, 10), kernel(7, 10, 5)]})
    assert serial["overlap_s"] == 0 and not serial["overlapped"]
    empty = stream_overlap.overlap_report({"traceEvents": []})
    assert empty == {"streams_busy_s": {}, "window_s": 0.0, "overlap_s": 0.0, "overlapped": False}
