"""Re-run every benchmark's full mode at one commit, then compare each result with the one it replaces.

Why: results measured at different commits cannot be set side by side, and a slowdown that lands between two
of them goes unnoticed. This runs every entry of ``bench/registry.py`` in turn (their order, one at a time,
nothing else on the machine), refuses to start from a tree with uncommitted changes (every result must name
the same commit), says up front what it will cost, and at the end writes ``bench/results/run_all.json``: the
commit, each benchmark's wall-clock and exit status, and a regression check of each new result against the
committed one it replaced (``git show HEAD:bench/results/NAME.json``). A metric is flagged when the two
runs' spreads do not overlap (new min above old max, or new max below old min): a change beyond the
repeat-to-repeat spread, up or down. Then ``python scripts/bench_docs.py`` regenerates every table.

Every benchmark in one sitting is about thirteen hours on 2 cores, more than a working session. ``--continue``
spreads it over several: it keeps every benchmark whose result is a full run measured on the code the tree has
now (no path it depends on, ``measured_code``, changed since any commit it was measured at: the project files
its run imports, as ``scripts/import_trace.py`` traced them, and the package's data files; the whole package
where it has no trace) and runs only the rest, adding to the summary;
a result measured apart on that same code (bench/long_tail.py continued with ``--extend``) is kept the same
way. The published results then all describe one code, though they name the commits they were measured at;
the summary says which benchmarks are still missing, and every regression check compares with the results as
they were where the series began (``base``). A change to a benchmark's measured code sends it back to the
list; a change to a module its run does not import leaves it current. A session's machine is not chosen, so
a series may span CPUs; ``--same-cpu`` also sends back every
result measured (in part) on another CPU than this machine's, so that absolute rates in one series compare.

``--quick`` runs every benchmark's ``--quick`` mode instead, into a temporary directory (a smoke test of the
whole sequence: nothing is compared or written under ``bench/results``).

    python bench/run_all.py [--continue [--same-cpu]] [--only NAME ...] [--skip NAME ...] [--allow-dirty]
                            [--dry-run] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# `python bench/run_all.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(ROOT)

from bench.harness import RESULTS_DIR, cpu_model, git_commit  # noqa: E402
from bench.provenance import code_changes_since, measured_at, measured_code, measured_on  # noqa: E402
from bench.registry import BENCHMARKS, Benchmark, by_result  # noqa: E402

SUMMARY = "run_all"


def numeric_stats(result: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, float]]]:
    """Every (name, {min, median, max}) a result reports: each arm's metrics and each ratio."""
    for arm, metrics in result.get("arms", {}).items():
        for metric, stats in metrics.items():
            if _is_stats(stats):
                yield f"{arm} / {metric}", stats
    for key, stats in result.get("ratios", {}).items():
        if _is_stats(stats):
            yield f"ratio {key}", stats


def _is_stats(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(value.get(k), int | float) for k in ("min", "median", "max")
    )


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The regression check of one benchmark: every metric both results have, flagged when their min–max
    spreads do not overlap, with the direction of the change."""
    before = dict(numeric_stats(old))
    flagged = []
    compared = 0
    for name, stats in numeric_stats(new):
        if name not in before:
            continue
        compared += 1
        previous = before[name]
        if stats["min"] > previous["max"] or stats["max"] < previous["min"]:
            flagged.append(
                {
                    "metric": name,
                    "before": [previous["min"], previous["median"], previous["max"]],
                    "after": [stats["min"], stats["median"], stats["max"]],
                    "change": stats["median"] / previous["median"] if previous["median"] else None,
                }
            )
    return {
        "previous_commit": old.get("commit"),
        "compared": compared,
        "flagged": flagged,
        "new_metrics": sum(1 for name, _ in numeric_stats(new) if name not in before),
    }


def committed_result(name: str, base: str = "HEAD") -> dict[str, Any] | None:
    """The result file as commit ``base`` holds it (what this run replaces), if it has one."""
    shown = subprocess.run(
        ["git", "show", f"{base}:{RESULTS_DIR}/{name}.json"], cwd=ROOT, capture_output=True, text=True
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else None


def regression(name: str, new: Mapping[str, Any], base: str) -> dict[str, Any]:
    """The regression check of a fresh result against the one it replaced (the file at ``base``, where the
    all-benchmarks run started); none where there was none, or it is the same measurement."""
    old = committed_result(name, base)
    if old is None or old.get("commit") == new.get("commit"):
        return {"previous_commit": None, "flagged": []}
    return compare(old, new)


def describes_the_code(benchmark: Benchmark, result: Mapping[str, Any]) -> bool:
    """Whether ``result`` is a full run measured on the code the tree has now: none of the benchmark's
    measured paths changed since any commit it was measured at. Such a result need not be measured again."""
    paths = measured_code(benchmark)
    return not result.get("quick") and all(code_changes_since(c, paths) == [] for c in measured_at(result))


def current_results() -> dict[str, dict[str, Any]]:
    """Every registered benchmark's result file that describes the code the tree has now."""
    results = {}
    for benchmark in BENCHMARKS:
        path = ROOT / RESULTS_DIR / f"{benchmark.result}.json"
        if path.exists() and describes_the_code(benchmark, result := json.loads(path.read_text())):
            results[benchmark.result] = result
    return results


def measured_elsewhere(results: Mapping[str, Mapping[str, Any]], cpu: str) -> set[str]:
    """The results measured, wholly or in part, on another CPU than ``cpu``: what ``--same-cpu`` runs again."""
    return {name for name, result in results.items() if measured_on(result) != [cpu]}


def split(
    chosen: list[Benchmark], on_the_code: Mapping[str, Any], elsewhere: set[str]
) -> tuple[list[Benchmark], list[str]]:
    """What a continued run measures and what it keeps: it runs each chosen benchmark without a result on the
    code (or with one measured on another CPU, ``elsewhere``, under ``--same-cpu``) and keeps every other
    result on the code, chosen or not, so that a run limited by ``--only`` drops nothing from the series."""
    todo = [b for b in chosen if b.result not in on_the_code or b.result in elsewhere]
    measured = {b.result for b in todo}
    return todo, [name for name in on_the_code if name not in measured]


def kept(
    benchmark: Benchmark, result: Mapping[str, Any], previous: Mapping[str, Any] | None, base: str
) -> dict:
    """The record of a benchmark a continued run does not re-run: the earlier run's record where it describes
    the result as it is now, else one made from its result (measured outside run_all, on the same code). Why
    the check: a result continued with ``--extend`` after its record was made gains stages (commits, wall
    time) that the old record leaves out: the long-tail record once missed two stages and 196 minutes."""
    if (
        previous is not None
        and previous.get("exit_status") == 0
        and previous.get("measured_at", measured_at(result)) == measured_at(result)
    ):
        return dict(previous)
    return {
        "command": " ".join(["python", *benchmark.args]),
        "expected_min": benchmark.minutes,
        "wall_min": result.get("run_wall_s", 0.0) / 60,
        "exit_status": 0,
        "commit": result["commit"],
        "measured_at": measured_at(result),
        "measured_apart": True,
        "regression": regression(benchmark.result, result, base),
    }


def run(benchmark: Benchmark, quick_dir: Path | None = None, base: str = "HEAD") -> dict[str, Any]:
    """One benchmark's full mode as a child process (its output streamed), timed, and its regression check
    against its result at ``base``; with ``quick_dir`` its ``--quick`` mode instead, writing there, checked
    for nothing but its exit status."""
    args = list(benchmark.args)
    if quick_dir is not None:
        args += ["--quick", "--out", str(quick_dir / f"{benchmark.result}.json")]
    print(
        f"\n=== {benchmark.result}: python {' '.join(args)} (expected ~{benchmark.minutes:g} min)", flush=True
    )
    started = time.perf_counter()
    status = subprocess.run([sys.executable, *args], cwd=ROOT).returncode
    record: dict[str, Any] = {
        "command": " ".join(["python", *args]),
        "expected_min": benchmark.minutes,
        "wall_min": (time.perf_counter() - started) / 60,
        "exit_status": status,
    }
    if benchmark.needs:
        record["needs"] = benchmark.needs
    path = ROOT / RESULTS_DIR / f"{benchmark.result}.json"
    if quick_dir is None and status == 0 and path.exists():
        new = json.loads(path.read_text())
        record["commit"] = new.get("commit")
        record["measured_at"] = measured_at(new)
        record["regression"] = regression(benchmark.result, new, base)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [b.result for b in BENCHMARKS]
    parser.add_argument("--only", nargs="*", choices=names, help="run only these (default: all)")
    parser.add_argument("--skip", nargs="*", choices=names, default=[], help="leave these out")
    parser.add_argument("--allow-dirty", action="store_true", help="run from a tree with uncommitted changes")
    parser.add_argument("--dry-run", action="store_true", help="say what would run and what it costs")
    parser.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="continue the last run (bench/results/run_all.json) in a later session: keep every benchmark "
        "whose result was measured on the code the tree has now, run the rest",
    )
    parser.add_argument(
        "--same-cpu",
        action="store_true",
        help="with --continue, also run again every benchmark whose result was measured (in part) on another "
        "CPU than this machine's, so the series ends on one machine",
    )
    parser.add_argument(
        "--quick", action="store_true", help="every benchmark's --quick mode, into a temp dir"
    )
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if (not args.only or b.result in args.only) and b.result not in args.skip]
    commit = git_commit()
    summary_path = ROOT / RESULTS_DIR / f"{SUMMARY}.json"
    resume = args.resume and not args.quick
    previous = json.loads(summary_path.read_text()) if resume and summary_path.exists() else {}
    on_the_code = current_results() if resume else {}
    here = cpu_model()
    elsewhere = measured_elsewhere(on_the_code, here) if args.same_cpu else set()
    todo, keep = split(chosen, on_the_code, elsewhere)
    total = sum(b.minutes for b in todo)
    print(f"{len(todo)} benchmarks at {commit}, full modes expected ~{total:.0f} min ({total / 60:.1f} h):")
    for benchmark in chosen:
        need = f"  [needs {benchmark.needs}]" if benchmark.needs else ""
        if benchmark.result in elsewhere:
            cpus = " and ".join(measured_on(on_the_code[benchmark.result]))
            need += f"  [again: measured on {cpus}; this machine is {here}]"
        state = "current, kept" if benchmark.result in keep else f"{benchmark.minutes:5.0f} min"
        print(f"  {state:>13}  python {' '.join(benchmark.args)}{need}")
    if args.dry_run:
        return
    if commit.endswith("+dirty") and not (args.allow_dirty or args.quick):
        sys.exit("run_all: the tree has uncommitted changes; commit them so every result names one commit")
    base = previous.get("base", commit.removesuffix("+dirty"))
    records = {
        name: kept(by_result(name), on_the_code[name], previous.get("benchmarks", {}).get(name), base)
        for name in keep
    }
    with tempfile.TemporaryDirectory(prefix="run-all-quick-") as tmp:
        quick_dir = Path(tmp) if args.quick else None
        if quick_dir:
            summary_path = quick_dir / f"{SUMMARY}.json"
        started = time.perf_counter()
        ran: list[str] = []

        def write_summary() -> None:  # after each benchmark: a crash keeps the rest
            session = {"commit": commit, "ran": ran, "wall_min": (time.perf_counter() - started) / 60}
            summary = {
                "commit": commit,
                "base": base,
                "expected_min": sum(b.minutes for b in BENCHMARKS),
                "wall_min": sum(r.get("wall_min", 0.0) for r in records.values()),
                "missing": [b.result for b in BENCHMARKS if b.result not in records],
                "sessions": [*previous.get("sessions", []), session],
                "benchmarks": {b.result: records[b.result] for b in BENCHMARKS if b.result in records},
            }
            summary_path.write_text(json.dumps(summary, indent=1) + "\n")

        write_summary()
        for benchmark in todo:
            records[benchmark.result] = run(benchmark, quick_dir, base)
            ran.append(benchmark.result)
            write_summary()
    failed = [name for name, record in records.items() if record["exit_status"] != 0]
    print(f"\nrun_all: {len(ran)} benchmarks run, {len(records) - len(ran)} kept; failed: {failed or 'none'}")
    if not args.quick:
        print("next: python scripts/bench_docs.py (every table, the headlines and the regression check)")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
