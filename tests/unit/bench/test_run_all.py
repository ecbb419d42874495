"""bench/run_all.py and bench/registry.py: every benchmark is registered with a script that exists, every
headline points at a section of docs/benchmarks.md, and the regression check flags a metric exactly when the
two runs' spreads no longer overlap."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run_all
from bench.harness import git_commit
from bench.provenance import load_traces, measured_at
from bench.registry import BENCHMARKS, GPU_RESULTS, by_result

ROOT = Path(__file__).resolve().parents[3]
HEAD = git_commit().removesuffix("+dirty")


def stats(low: float, mid: float, high: float) -> dict[str, object]:
    return {"min": low, "median": mid, "max": high, "runs": [low, mid, high]}


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_result_file_is_written_by_a_registered_benchmark() -> None:
    registered = {b.result for b in BENCHMARKS}
    results = {path.stem for path in (ROOT / "bench/results").glob("*.json")} - {run_all.SUMMARY}
    assert results - set(GPU_RESULTS) <= registered, "a result no benchmark of bench/registry.py rewrites"
    assert all((ROOT / b.args[0]).is_file() for b in BENCHMARKS)
    assert len(registered) == len(BENCHMARKS), "two benchmarks write one result file"


def test_every_headline_links_to_a_section_of_a_benchmark_family_page() -> None:
    text = "\n".join(page.read_text() for page in (ROOT / "docs/benchmarks").glob("*.md"))
    anchors = {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    sections = {h.section for b in BENCHMARKS for h in b.headlines}
    assert sections and sections <= anchors, sections - anchors


def test_regression_check_flags_only_spreads_that_do_not_overlap() -> None:
    old = {"commit": "a", "arms": {"x": {"rate": stats(10, 11, 12), "steady": stats(5, 6, 7)}}, "ratios": {}}
    new = {
        "commit": "b",
        "arms": {"x": {"rate": stats(8, 8.5, 9.5), "steady": stats(6.5, 7, 8), "fresh": stats(1, 1, 1)}},
        "ratios": {"r": stats(1, 1, 1)},
    }
    got = run_all.compare(old, new)
    assert got["previous_commit"] == "a" and got["compared"] == 2 and got["new_metrics"] == 2
    [flag] = got["flagged"]
    assert flag["metric"] == "x / rate" and flag["change"] == 8.5 / 11


def test_a_dry_run_states_every_benchmark_and_the_total_cost(user_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "bench/run_all.py", "--dry-run"],
        cwd=ROOT,
        env=user_env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    total = sum(b.minutes for b in BENCHMARKS)
    assert f"expected ~{total:.0f} min" in done.stdout
    assert all(f"python {' '.join(b.args)}" in done.stdout for b in BENCHMARKS)


@pytest.mark.slow  # a benchmark's --quick run: CI runs it with the other slow tests
def test_quick_runs_each_chosen_benchmark_quick_mode(user_env: dict[str, str]) -> None:
    command = [sys.executable, "bench/run_all.py", "--quick", "--only", "simulator"]
    done = subprocess.run(command, cwd=ROOT, env=user_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bench/simulator.py --quick --out" in done.stdout and "failed: none" in done.stdout


def test_without_a_trace_a_benchmark_depends_on_the_package_its_script_and_the_bench_modules_it_imports() -> (
    None
):
    code = run_all.measured_code(by_result("critic_learning"), traces={})
    assert code[:2] == ("asyncrl", "pyproject.toml")
    assert {"bench/critic_learning.py", "bench/agentic_learning.py", "bench/harness.py"} <= set(code)
    # followed through bench.default_run
    assert "bench/trainer.py" in run_all.measured_code(by_result("lora"), traces={})


def test_with_a_trace_a_benchmark_depends_on_what_its_run_imported_and_its_registered_extras() -> None:
    traced = {"paths": ["asyncrl/rle.py", "bench/long_tail.py", "bench/harness.py", "pyproject.toml"]}
    code = run_all.measured_code(by_result("long_tail"), traces={"long_tail": traced})
    assert code == ("asyncrl/rle.py", "bench/harness.py", "pyproject.toml")  # its script derives only
    code = run_all.measured_code(by_result("async_vs_sync"), traces={"async_vs_sync": traced})
    assert code[-1] == "asyncrl"  # its --quick runs inline, its full mode on Ray: the package stays measured


def test_editing_a_module_a_benchmark_does_not_import_leaves_its_result_current(tmp_path: Path) -> None:
    """In a scratch repository: a result measured at a commit stays current across an edit to a module its
    traced run did not import, and goes stale on an edit to one it did."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    (tmp_path / "asyncrl").mkdir()
    for name in ("used.py", "unrelated.py"):
        (tmp_path / "asyncrl" / name).write_text("X = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "measured")
    commit = git("rev-parse", "HEAD").strip()
    trace = {"paths": ["asyncrl/used.py"]}
    paths = run_all.measured_code(by_result("trainer"), traces={"trainer": trace})
    (tmp_path / "asyncrl" / "unrelated.py").write_text("X = 2\n")
    assert run_all.code_changes_since(commit, paths, root=tmp_path) == []
    (tmp_path / "asyncrl" / "used.py").write_text("X = 2\n")
    assert run_all.code_changes_since(commit, paths, root=tmp_path) == ["asyncrl/used.py"]


def test_every_stored_trace_names_its_script_and_leaves_modules_its_run_does_not_import() -> None:
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "asyncrl").rglob("*.py")}
    for name, trace in load_traces().items():
        benchmark = by_result(name)
        assert {benchmark.args[0], "pyproject.toml"} <= set(trace["paths"]), name
        assert "asyncrl" not in trace["paths"] and all(Path(ROOT / p).is_file() for p in trace["paths"]), name
        if not benchmark.measured_code:  # an edit to a module outside its trace leaves its result current
            assert modules - set(run_all.measured_code(benchmark)), name


def test_a_result_is_current_only_where_its_measured_code_is_unchanged_since_every_commit_it_names() -> None:
    trainer = by_result("trainer")
    if HEAD == "unknown" or run_all.code_changes_since(HEAD, run_all.measured_code(trainer)) != []:
        pytest.skip("the trainer benchmark's code has uncommitted changes here")
    full = {"commit": HEAD, "quick": False}
    assert run_all.describes_the_code(trainer, full)
    assert not run_all.describes_the_code(trainer, full | {"quick": True})
    assert not run_all.describes_the_code(trainer, full | {"commit": HEAD + "+dirty"})
    assert not run_all.describes_the_code(trainer, full | {"commit": "0" * 40})  # unknown here
    stopped = full | {"studies": {"sweep": {"commit": "0" * 40}, "curve": {"commit": HEAD}}}
    assert measured_at(stopped) == sorted({"0" * 40, HEAD})
    assert not run_all.describes_the_code(trainer, stopped)


def test_same_cpu_runs_again_every_result_measured_in_part_on_another_cpu() -> None:
    def on(cpu: str, **studies: dict[str, str]) -> dict[str, object]:
        return {"machine": {"cpu_model": cpu}, "studies": studies}

    results = {
        "here": on("intel"),
        "there": on("amd"),
        "both": on("intel", sweep={"cpu_model": "amd"}, curve={}),
        "curve_continued": on(
            "intel", curve={"point_provenance": {"a": {"cpu_model": "amd"}, "b": {"cpu_model": "intel"}}}
        ),
        "stages_here": on("amd", sweep={"cpu_model": "intel"}),
    }
    assert run_all.measured_elsewhere(results, "intel") == {"there", "both", "curve_continued"}
    assert run_all.measured_elsewhere(results, "amd") == {"here", "both", "curve_continued", "stages_here"}


def test_a_continued_run_measures_what_is_missing_or_elsewhere_among_the_chosen_and_keeps_the_rest() -> None:
    chosen = [by_result("trainer"), by_result("lora"), by_result("simulator")]
    on_the_code = {"trainer": {}, "lora": {}, "engine": {}}
    todo, keep = run_all.split(chosen, on_the_code, elsewhere={"trainer", "engine"})
    assert [b.result for b in todo] == ["trainer", "simulator"]
    assert keep == ["lora", "engine"]  # engine: measured elsewhere, but not chosen, so kept in the series
    todo, keep = run_all.split(chosen, on_the_code, elsewhere=set())
    assert [b.result for b in todo] == ["simulator"] and keep == ["trainer", "lora", "engine"]


def test_a_kept_result_measured_apart_is_recorded_with_its_commits_and_no_self_comparison() -> None:
    result = {"commit": "abc", "run_wall_s": 600.0, "studies": {"sweep": {"commit": "def"}}}
    record = run_all.kept(by_result("long_tail"), result, None, base="HEAD")
    assert record["measured_apart"] and record["measured_at"] == ["abc", "def"]
    assert record["wall_min"] == 10.0 and record["exit_status"] == 0
    earlier = {"exit_status": 0, "wall_min": 170.0, "commit": "abc"}
    assert run_all.kept(by_result("long_tail"), result, earlier, base="HEAD") == earlier


def test_a_kept_record_is_made_again_when_its_result_gained_stages_since() -> None:
    """The long-tail record once named three of the five commits its result was measured at and 126 of its
    322 minutes: a record older than its result's stages is made again from the result."""
    result = {
        "commit": "abc",
        "run_wall_s": 600.0,
        "studies": {"sweep": {"commit": "def"}, "curve": {"commit": "x"}},
    }
    earlier = {"exit_status": 0, "wall_min": 2.0, "commit": "abc", "measured_at": ["abc", "def"]}
    record = run_all.kept(by_result("long_tail"), result, earlier, base="HEAD")
    assert record["measured_at"] == ["abc", "def", "x"] and record["wall_min"] == 10.0
