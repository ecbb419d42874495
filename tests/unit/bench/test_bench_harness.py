"""The harness interleaves arms, keeps every repeat, pairs ratios by repeat, and refuses results without spread."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import harness


def test_arms_run_interleaved_with_rotating_order_and_every_repeat_kept() -> None:
    calls: list[str] = []
    counter = {"a": 0, "b": 0}

    def arm(name: str):
        def run() -> dict[str, float]:
            calls.append(name)
            counter[name] += 1
            return {"x": float(counter[name])}

        return run

    raw = harness.run_arms({"a": arm("a"), "b": arm("b")}, repeats=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [run["x"] for run in raw["a"]] == [1.0, 2.0, 3.0]
    stats = harness.summarize(raw)["a"]["x"]
    assert stats == {"min": 1.0, "median": 2.0, "max": 3.0, "runs": [1.0, 2.0, 3.0]}


def test_ratio_is_per_paired_repeat_not_ratio_of_medians() -> None:
    raw = {"a": [{"t": 2.0}, {"t": 9.0}, {"t": 4.0}], "b": [{"t": 1.0}, {"t": 9.0}, {"t": 1.0}]}
    ratio = harness.paired_ratio(raw, "a", "b", "t")
    assert ratio["runs"] == [2.0, 1.0, 4.0]
    assert ratio["median"] == 2.0  # the ratio of medians would be 4 / 1 = 4
    with pytest.raises(ValueError, match="not paired"):
        harness.paired_ratio({"a": raw["a"], "b": raw["b"][:2]}, "a", "b", "t")


def test_fewer_than_three_repeats_is_refused_unless_quick() -> None:
    assert harness.repeats_for(argparse.Namespace(quick=True, repeats=1)) == 1
    with pytest.raises(SystemExit, match="repeats"):
        harness.repeats_for(argparse.Namespace(quick=False, repeats=2))


def test_written_result_follows_the_schema(tmp_path) -> None:
    args = argparse.Namespace(quick=True, out=str(tmp_path / "x.json"))
    raw = {"a": [{"t": 2.0}], "b": [{"t": 1.0}]}
    harness.write_result(
        args,
        "x",
        raw,
        ratios={"t": harness.paired_ratio(raw, "a", "b", "t")},
        resources={"a": {"threads": 1}},
    )
    result = json.loads((tmp_path / "x.json").read_text())
    harness.check_schema(result)
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu_model"]
    del result["arms"]["a"]["t"]["runs"]
    with pytest.raises(ValueError, match=r"a\.t lacks \['runs'\]"):
        harness.check_schema(result)


def test_a_named_commit_overrides_what_git_says(monkeypatch) -> None:
    monkeypatch.delenv("ASYNCRL_BENCH_COMMIT", raising=False)
    from_git = harness.git_commit()
    assert from_git != "0123abc"
    monkeypatch.setenv("ASYNCRL_BENCH_COMMIT", "0123abc")
    assert harness.git_commit() == "0123abc"
