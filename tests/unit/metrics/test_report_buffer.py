"""The report's buffer chart keeps occupancy (tens of groups) off the axis of cumulative counts (thousands)."""

from __future__ import annotations

from asyncrl.app.train import buffer_metrics
from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.metrics import report
from asyncrl.metrics.report import CUMULATIVE_BUFFER_SERIES, RunSeries, buffer_panels


def test_cumulative_counts_go_to_their_own_panel():
    series = {
        "buffer/buffered_groups": [3.0, 4.0],
        "buffer/in_flight_groups": [8.0, 6.0],
        "buffer/admitted_groups": [40.0, 5000.0],
    }
    occupancy, cumulative = buffer_panels(series)
    assert occupancy == {"buffer/buffered_groups": [3.0, 4.0], "buffer/in_flight_groups": [8.0, 6.0]}
    assert cumulative == {"buffer/admitted_groups": [40.0, 5000.0]}


def test_every_buffer_metric_a_run_writes_is_occupancy_or_a_known_cumulative_count():
    """A run's ``buffer/*`` metrics are exactly these: a new cumulative one must join
    ``CUMULATIVE_BUFFER_SERIES``, or it flattens the occupancy lines again."""
    buffer = SampleBuffer(BufferConfig(), groups_per_batch=2, group_size=2)
    keys = {key for key in buffer_metrics(buffer) if key.startswith("buffer/")}
    assert (
        keys
        == {
            "buffer/buffered_groups",
            "buffer/in_flight_groups",
            "buffer/stale_in_flight_groups",
        }
        | CUMULATIVE_BUFFER_SERIES
    )


def test_the_chart_draws_occupancy_and_counts_on_two_axes(tmp_path, monkeypatch):
    drawn = {}
    save = report._save

    def keep_axes(plt, fig, path, axes):
        drawn.update(
            {ax.get_title(): {line.get_label(): list(line.get_ydata()) for line in ax.lines} for ax in axes}
        )
        return save(plt, fig, path, axes)

    monkeypatch.setattr(report, "_save", keep_axes)
    run = RunSeries(
        name="run",
        kind="real",
        steps=[1, 2],
        elapsed_s=[1.0, 2.0],
        reward=None,
        length_mean=None,
        length_p99=None,
        staleness={},
        buffer={"buffer/buffered_groups": [3.0, 4.0], "buffer/admitted_groups": [40.0, 5000.0]},
    )
    assert report.plot_buffer([run], tmp_path / "buffer.png").read_bytes()[:4] == b"\x89PNG"
    assert drawn == {
        "buffer occupancy after each step": {"run buffered_groups": [3.0, 4.0]},
        "groups admitted since the start": {"run admitted_groups": [40.0, 5000.0]},
    }
