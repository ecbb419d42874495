"""Regenerate the numbers tables in docs/benchmarks.md from bench/results/*.json, so no number is typed by hand.

Each benchmark's table lives between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in the docs; this
script rewrites what is between them from ``bench/results/NAME.json``: every arm's metrics as median (min–max)
over its repeats (one row per arm when a sweep has many), then the paired ratios and the targets if any. A result file that predates the harness schema (no repeats, no
spread) is not quoted: its block says so, and the prose around it is from a single run.

    python scripts/bench_docs.py           # rewrite docs/benchmarks.md
    python scripts/bench_docs.py --check   # exit 1 if the docs are out of sync with the JSON
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.harness import SCHEMA_VERSION, check_schema

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- bench:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)


def number(value: float) -> str:
    """Three significant figures, thousands separated: enough for numbers with tens of per cent spread."""
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def spread(stats: dict[str, Any]) -> str:
    return f"{number(stats['median'])} ({number(stats['min'])}–{number(stats['max'])})"


def render(name: str, results_dir: Path) -> str:
    """The markdown for one benchmark's block."""
    path = results_dir / f"{name}.json"
    if not path.exists():
        return f"_No result yet: run the command above to write `bench/results/{name}.json`._\n"
    result = json.loads(path.read_text())
    if result.get("schema") != SCHEMA_VERSION:
        return (
            f"_Not yet re-measured under the new rules: `bench/results/{name}.json` predates the harness "
            f"(one run per arm, no spread), so its numbers are not quoted here._\n"
        )
    check_schema(result)
    machine = result["machine"]
    lines = [
        f"Measured at commit `{result['commit'][:12]}` on {machine['cpu_model']} ({machine['cores']} cores, "
        f"{machine['torch_threads']} torch threads, torch {machine['torch']}), {result['repeats']} interleaved "
        f"repeats per arm{' (--quick: a smoke run, not a result)' if result['quick'] else ''}; "
        f"median (min–max). Command: `{result['command']}`.",
        "",
        *arms_table(result["arms"]),
    ]
    if result["ratios"]:
        lines += ["", "| ratio (per paired repeat) | median (min–max) |", "|---|---:|"]
        for key, stats in result["ratios"].items():
            label = f"{key}: {stats['numerator']} / {stats['denominator']} {stats['metric']}"
            lines.append(f"| {label} | {spread(stats)} |")
    lines += derived_rows(result)
    lines += render_table(result.get("table"))
    lines.append(f"\nResources: `{json.dumps(result['resources'])}`.")
    return "\n".join(lines) + "\n"


STANDARD_KEYS = {
    "schema",
    "benchmark",
    "command",
    "commit",
    "quick",
    "repeats",
    "machine",
    "resources",
    "setup",
}
STANDARD_KEYS |= {"arms", "ratios", "table"}


def derived_rows(result: dict[str, Any]) -> list[str]:
    """What a benchmark derived beyond its arms (bounds, ceilings, targets): every summary (``min``/``median``/
    ``max``) and every yes/no target found under its extra keys, as one more table."""
    rows: list[str] = []

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict) and {"min", "median", "max"} <= set(value):
            rows.append(f"| {path} | {spread(value)} |")
        elif isinstance(value, bool):
            rows.append(f"| {path} | {'met' if value else 'not met'} |")
        elif isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{path} / {key}" if path else key, inner)

    for key, value in result.items():
        if key not in STANDARD_KEYS:
            walk(key, value)
    return ["", "| derived | median (min–max) |", "|---|---:|", *rows] if rows else []


def cell(value: Any) -> str:
    """A table cell: numbers as ``number`` writes them, anything else (names, yes/no) as text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return number(value)
    return str(value)


def render_table(table: dict[str, Any] | None) -> list[str]:
    """A benchmark's own derived table (``{"title", "columns", "rows"}`` in its result, e.g. predictions set
    beside measurements), numbers formatted like the arms'; nothing when the result has none."""
    if not table:
        return []
    lines = ["", f"{table['title']}:", "", "| " + " | ".join(table["columns"]) + " |"]
    lines.append("|" + "---|" * len(table["columns"]))
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in table["rows"]]
    return lines


WIDE_FROM_ARMS = 4
"""From this many arms sharing their metrics, one row per arm (a column per metric) instead of per metric."""


def arms_table(arms: dict[str, dict[str, Any]]) -> list[str]:
    """The arms' metrics as markdown rows: one row per (arm, metric), or one per arm when many arms share
    the same metrics (a sweep), so the table stays readable."""
    metrics = list(next(iter(arms.values())))
    if len(arms) >= WIDE_FROM_ARMS and all(list(m) == metrics for m in arms.values()):
        lines = ["| arm | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
        return lines + [
            f"| {arm} | " + " | ".join(spread(stats[m]) for m in metrics) + " |"
            for arm, stats in arms.items()
        ]
    lines = ["| arm | metric | median (min–max) |", "|-----|--------|-----------------:|"]
    for arm, stats in arms.items():
        lines += [f"| {arm} | {metric} | {spread(values)} |" for metric, values in stats.items()]
    return lines


def regenerate(text: str, results_dir: Path) -> str:
    """``text`` with every bench block's body rebuilt from the results."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name"), results_dir) + m.group(4), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the docs are not what the JSON says")
    parser.add_argument("--docs", default=str(ROOT / "docs/benchmarks.md"))
    parser.add_argument("--results", default=str(ROOT / "bench/results"))
    args = parser.parse_args()
    docs = Path(args.docs)
    text = docs.read_text()
    fresh = regenerate(text, Path(args.results))
    if args.check:
        if fresh != text:
            sys.exit(f"{docs} is out of sync with {args.results}: run python scripts/bench_docs.py")
        return
    docs.write_text(fresh)


if __name__ == "__main__":
    main()
