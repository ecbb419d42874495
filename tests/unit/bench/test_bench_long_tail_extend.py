"""bench/long_tail.py --extend refuses a stopped run it cannot honestly continue: another workload, a --quick run
into a full one, or a run measured on code that has changed since (the end-to-end continuation is a slow test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import harness
from bench.long_tail import MEASURED_CODE, Bench, load_stopped_run, run_setup
from bench.provenance import code_changes_since
from bench.workloads import QUICK_LONG_TAIL

HEAD = harness.git_commit().removesuffix("+dirty")


def stopped_run(tmp_path: Path, **changes: object) -> Path:
    result = {
        "commit": HEAD,
        "command": "python bench/long_tail.py --quick --stages sweep",
        "quick": True,
        "machine": {"cpu_model": "the stopped run's CPU"},
        "setup": json.loads(json.dumps(run_setup(QUICK_LONG_TAIL, ["sweep"]))),
        "arms": {
            "sweep/sync_batch": {"samples_per_s": {"runs": [1.0, 2.0, 3.0]}, "step_s": {"runs": [3, 2, 1]}}
        },
        "ratios": {},
        "timelines": {"sweep/sync_batch": [[{"elapsed_s": 1.0}]] * 3},
        "studies": {"sweep": {"title": "t", "points": ["sweep/sync_batch"], "steps": 2, "wall_s": 1.0}},
        "best_sync": {"name": "sync_batch"},
    } | changes
    path = tmp_path / "stopped.json"
    path.write_text(json.dumps(result))
    return path


def bench(tmp_path: Path) -> Bench:
    return Bench(QUICK_LONG_TAIL, 3, tmp_path, 2)


def test_a_stopped_run_loads_every_repeat_and_its_best_sync(tmp_path: Path) -> None:
    if code_changes_since(HEAD, MEASURED_CODE) != []:
        pytest.skip("the measured code has uncommitted changes here: a continued run is refused on them")
    loaded = bench(tmp_path)
    assert load_stopped_run(loaded, stopped_run(tmp_path), quick=True) == ["sweep"]
    assert loaded.raw["sweep/sync_batch"] == [
        {"samples_per_s": 1.0, "step_s": 3},
        {"samples_per_s": 2.0, "step_s": 2},
        {"samples_per_s": 3.0, "step_s": 1},
    ]
    assert loaded.best_sync is not None and loaded.best_sync.name == "sync_batch"
    assert loaded.studies["sweep"]["commit"] == HEAD
    # a stage measured before a continuation keeps the CPU it ran on: the next session's machine may differ
    assert loaded.studies["sweep"]["cpu_model"] == "the stopped run's CPU"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"quick": False}, "extend it in kind"),
        ({"setup": {"name": "other", "stages": ["sweep"]}}, "another workload"),
        ({"commit": "0" * 40}, "measured code"),
        ({"commit": HEAD + "+dirty"}, "measured code"),
    ],
)
def test_a_run_that_cannot_be_continued_is_refused_by_name(
    tmp_path: Path, changes: dict, message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        load_stopped_run(bench(tmp_path), stopped_run(tmp_path, **changes), quick=True)
