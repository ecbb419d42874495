"""bench/sim_studies.py merges studies, and points of one study, run in separate processes: a later run's point
replaces an earlier one's, the study's paired ratios are recomputed over the merged points seed by seed, and
each point keeps the provenance it ran with (no simulation runs here)."""

from __future__ import annotations

from typing import Any

from bench import harness
from bench.sim_studies import merged


def stats(*runs: float) -> dict[str, Any]:
    return harness.summary(runs)


def result(
    commit: str, arms: dict[str, dict[str, Any]], studies: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    return {
        "schema": harness.SCHEMA_VERSION,
        "benchmark": "sim_studies",
        "command": f"python bench/sim_studies.py # {commit}",
        "commit": commit,
        "quick": False,
        "repeats": 3,
        "machine": {"cpu_model": f"cpu-{commit}"},
        "resources": {},
        "setup": {"seeds": [0, 1, 2]},
        "arms": arms,
        "ratios": {},
        "studies": studies,
    }


def dora(commit: str, labels: list[str]) -> dict[str, Any]:
    provenance = {"commit": commit, "run_command": f"run {commit}", "cpu_model": f"cpu-{commit}"}
    return {
        "title": "dora",
        "command": "asyncrl simulate ...",
        "steps": 8,
        "points": {label: [] for label in labels},
        "wall_s": {"a": 10.0, "b": 30.0, "c": 20.0}[commit],
        **provenance,
        "point_provenance": {label: provenance for label in labels},
    }


def test_points_run_apart_merge_into_one_study_with_ratios_recomputed_per_seed() -> None:
    sync = {"mean_step_s": stats(4.0, 6.0, 8.0)}
    multi_version = {"mean_step_s": stats(2.0, 2.0, 4.0)}
    stale = {"mean_step_s": stats(1.0, 1.0, 1.0)}
    drain = {"steady_mean_step_s": stats(1.0, 2.0, 3.0)}
    first = result(
        "a",
        {"dora/sync_64": sync, "dora/multi_version_64": stale, "drain/true": drain},
        {
            "dora": dora("a", ["sync_64", "multi_version_64"]),
            "drain": {"points": {"true": []}, "wall_s": 5.0},
        },
    )
    second = result("b", {"dora/multi_version_64": multi_version}, {"dora": dora("b", ["multi_version_64"])})
    third = result("c", {"dora/sync_128": sync}, {"dora": dora("c", ["sync_128"])})
    out = merged([first, second, third])
    harness.check_schema(out)
    assert list(out["studies"]) == ["drain", "dora"]  # the order studies() lists them
    study = out["studies"]["dora"]
    assert list(study["points"]) == ["sync_64", "multi_version_64", "sync_128"]  # the study's own order
    assert out["arms"]["dora/multi_version_64"] == multi_version  # the later run's point wins
    ratio = out["ratios"]["dora/sync_over_multi_version_64"]
    assert ratio["runs"] == [2.0, 3.0, 2.0]  # seed by seed, over the merged points
    assert "dora/sync_over_multi_version_128" not in out["ratios"]  # its denominator never ran
    assert {label: p["commit"] for label, p in study["point_provenance"].items()} == {
        "sync_64": "a",
        "multi_version_64": "b",
        "sync_128": "c",
    }
    assert study["wall_s"] == 30.0  # side by side: the longest part
    # a study run before studies recorded their provenance is labelled with its result's
    assert out["studies"]["drain"]["commit"] == "a" and out["studies"]["drain"]["cpu_model"] == "cpu-a"
    assert out["arms"]["drain/true"] == drain
