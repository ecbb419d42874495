"""Re-run every benchmark's full mode at one commit, then compare each result with the one it replaces.

Why: results measured at different commits cannot be set side by side, and a slowdown that lands between two
of them goes unnoticed. This runs every entry of ``bench/registry.py`` in turn (their order, one at a time,
nothing else on the machine), refuses to start from a tree with uncommitted changes (every result must name
the same commit), says up front what it will cost, and at the end writes ``bench/results/run_all.json``: the
commit, each benchmark's wall-clock and exit status, and a regression check of each new result against the
committed one it replaced (``git show HEAD:bench/results/NAME.json``). A metric is flagged when the two
runs' spreads do not overlap (new min above old max, or new max below old min): a change beyond the
repeat-to-repeat spread, up or down. Then ``python scripts/bench_docs.py`` regenerates every table.

``--quick`` runs every benchmark's ``--quick`` mode instead, into a temporary directory (a smoke test of the
whole sequence: nothing is compared or written under ``bench/results``).

    python bench/run_all.py [--only NAME ...] [--skip NAME ...] [--allow-dirty] [--dry-run] [--quick]
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

from bench.harness import RESULTS_DIR, git_commit  # noqa: E402
from bench.registry import BENCHMARKS, Benchmark  # noqa: E402

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


def committed_result(name: str) -> dict[str, Any] | None:
    """The result file as the checked-out commit holds it (what this run replaces), if it has one."""
    shown = subprocess.run(
        ["git", "show", f"HEAD:{RESULTS_DIR}/{name}.json"], cwd=ROOT, capture_output=True, text=True
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else None


def run(benchmark: Benchmark, quick_dir: Path | None = None) -> dict[str, Any]:
    """One benchmark's full mode as a child process (its output streamed), timed, and its regression check;
    with ``quick_dir`` its ``--quick`` mode instead, writing there, checked for nothing but its exit status."""
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
        old = committed_result(benchmark.result)
        record["commit"] = new.get("commit")
        record["regression"] = compare(old, new) if old else {"previous_commit": None, "flagged": []}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [b.result for b in BENCHMARKS]
    parser.add_argument("--only", nargs="*", choices=names, help="run only these (default: all)")
    parser.add_argument("--skip", nargs="*", choices=names, default=[], help="leave these out")
    parser.add_argument("--allow-dirty", action="store_true", help="run from a tree with uncommitted changes")
    parser.add_argument("--dry-run", action="store_true", help="say what would run and what it costs")
    parser.add_argument(
        "--quick", action="store_true", help="every benchmark's --quick mode, into a temp dir"
    )
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if (not args.only or b.result in args.only) and b.result not in args.skip]
    commit = git_commit()
    total = sum(b.minutes for b in chosen)
    print(f"{len(chosen)} benchmarks at {commit}, full modes expected ~{total:.0f} min ({total / 60:.1f} h):")
    for benchmark in chosen:
        need = f"  [needs {benchmark.needs}]" if benchmark.needs else ""
        print(f"  {benchmark.minutes:5.0f} min  python {' '.join(benchmark.args)}{need}")
    if args.dry_run:
        return
    if commit.endswith("+dirty") and not (args.allow_dirty or args.quick):
        sys.exit("run_all: the tree has uncommitted changes; commit them so every result names one commit")
    with tempfile.TemporaryDirectory(prefix="run-all-quick-") as tmp:
        quick_dir = Path(tmp) if args.quick else None
        summary_path = (quick_dir or ROOT / RESULTS_DIR) / f"{SUMMARY}.json"
        started = time.perf_counter()
        records: dict[str, Any] = {}
        for benchmark in chosen:
            records[benchmark.result] = run(benchmark, quick_dir)
            wall = (time.perf_counter() - started) / 60
            summary = {"commit": commit, "expected_min": total, "wall_min": wall, "benchmarks": records}
            summary_path.write_text(
                json.dumps(summary, indent=1) + "\n"
            )  # after each: a crash keeps the rest
    failed = [name for name, record in records.items() if record["exit_status"] != 0]
    print(f"\nrun_all: {len(records)} benchmarks in {wall:.1f} min; failed: {failed or 'none'}")
    if not args.quick:
        print("next: python scripts/bench_docs.py (every table, the headlines and the regression check)")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
