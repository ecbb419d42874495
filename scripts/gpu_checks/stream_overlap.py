"""Did kernels of two CUDA streams run at the same time? Read from a profiler window of a running job.

The colocate section's async-on-one-device run puts the engine on a stream of its own (``engine.cuda_stream:
own``) beside the trainer's default stream; its step times alone cannot say whether the two ran side by side
or merely took turns. ``ProfileWindow`` profiles the device for a few seconds once the run's first step is
logged (start-up over), and ``overlap_report`` measures, from the trace's kernels, how long kernels of two or
more streams were running at once. A measurement, never a check: the window is short and the overlap depends
on what each side was doing in it.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

Interval = tuple[float, float]


def kernel_intervals(trace: dict[str, Any]) -> dict[int, list[Interval]]:
    """Per stream, each kernel's ``(start, end)`` in microseconds, from a Chrome trace as
    ``torch.profiler``'s ``export_chrome_trace`` writes it (category ``kernel``, ``ts`` and ``dur`` in µs,
    the stream in ``args.stream``)."""
    streams: dict[int, list[Interval]] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or "stream" not in event.get("args", {}):
            continue
        start = float(event["ts"])
        streams.setdefault(int(event["args"]["stream"]), []).append((start, start + float(event["dur"])))
    return streams


def merged(intervals: list[Interval]) -> list[Interval]:
    """``intervals`` as disjoint ones covering the same time."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def overlap_report(trace: dict[str, Any]) -> dict[str, Any]:
    """Each stream's busy seconds, the window the kernels span, and the seconds during which kernels of at
    least two streams were running."""
    streams = {stream: merged(spans) for stream, spans in kernel_intervals(trace).items()}
    edges = sorted(
        (time_us, step)
        for spans in streams.values()
        for start, end in spans
        for time_us, step in ((start, 1), (end, -1))
    )
    overlap_us, running, previous = 0.0, 0, 0.0
    for time_us, step in edges:  # a stream's own spans are disjoint, so `running` counts streams
        if running >= 2:
            overlap_us += time_us - previous
        running, previous = running + step, time_us
    window_us = edges[-1][0] - edges[0][0] if edges else 0.0
    return {
        "streams_busy_s": {str(s): sum(e - b for b, e in spans) / 1e6 for s, spans in streams.items()},
        "window_s": window_us / 1e6,
        "overlap_s": overlap_us / 1e6,
        "overlapped": overlap_us > 0,
    }


class ProfileWindow:
    """On a thread: wait (at most ``deadline_s``) for ``metrics_path`` to log a training step, then profile
    the device's kernels for ``seconds`` and keep ``overlap_report`` of them (or the error, as text)."""

    def __init__(self, metrics_path: Path, seconds: float = 2.0, deadline_s: float = 300.0) -> None:
        self.metrics_path, self.seconds, self.deadline_s = metrics_path, seconds, deadline_s
        self.report: dict[str, Any] = {}
        self._run_over = threading.Event()
        self._thread = threading.Thread(target=self._run, name="profile-window", daemon=True)
        self._thread.start()

    def result(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The report, once the window is over (an ``error`` entry if it never opened or failed). Call it when
        the run is over: a window not yet open then never opens."""
        self._run_over.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return {"error": f"the profile window did not close within {timeout_s} s of the run's end"}
        return self.report

    def _run(self) -> None:
        try:
            if not self._first_step_logged():
                self.report = {"error": "the run logged no training step before it ended (or the deadline)"}
                return
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                time.sleep(self.seconds)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(path))
                self.report = overlap_report(json.loads(path.read_text()))
        except Exception as error:  # deliberate: a measurement's failure is recorded, never the run's
            self.report = {"error": f"{type(error).__name__}: {error}"}

    def _first_step_logged(self) -> bool:
        deadline = time.monotonic() + self.deadline_s
        while time.monotonic() < deadline and not self._run_over.is_set():
            if self.metrics_path.is_file() and "train/version" in self.metrics_path.read_text():
                return True
            self._run_over.wait(0.5)
        return False
