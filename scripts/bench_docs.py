"""Regenerate the numbers tables in README.md and docs/*.md from bench/results/*.json, so no number is typed by hand.

Each benchmark's table lives between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in the docs; this
script rewrites what is between them from ``bench/results/NAME.json``: every arm's metrics as median (min–max)
over its repeats (one row per arm when a sweep has many), then the paired ratios and the targets if any. A result file that predates the harness schema (no repeats, no
spread) is not quoted: its block says so, and the prose around it is from a single run.

A result that holds several ``studies`` (``bench/sim_studies.py``: one per table of docs/simulator.md) is too
big for one table: ``<!-- bench:NAME -->`` then renders an index of its studies, and each study's own table
sits where the docs discuss it, between ``<!-- bench:NAME:STUDY -->`` and ``<!-- /bench:NAME:STUDY -->``
(the arms and ratios named ``STUDY/...``, with the reference figures the study quotes beside its ratios).

    python scripts/bench_docs.py           # rewrite every doc with a block
    python scripts/bench_docs.py --check   # exit 1 if a doc is out of sync with the JSON
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python scripts/bench_docs.py` puts scripts/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import re
import statistics
from typing import Any

from bench.harness import SCHEMA_VERSION, TIME_TO_REWARD, check_schema
from bench.provenance import measured_at, measured_on, study_cpus
from bench.registry import BENCHMARKS

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"(<!-- bench:(?P<name>[a-z_]+(?::[a-z_]+)?) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL
)


def commit_label(commit: str) -> str:
    """The commit a result was measured at, short, saying so when the code had uncommitted changes then."""
    sha, dirty, _ = commit.partition("+dirty")
    return f"`{sha[:12]}`" + (" (with uncommitted changes)" if dirty else "")


def number(value: float) -> str:
    """Three significant figures, thousands separated: enough for numbers with tens of per cent spread."""
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def spread(stats: dict[str, Any]) -> str:
    if stats.get("kind") == TIME_TO_REWARD:
        return time_to_reward_cell(stats)
    return f"{number(stats['median'])} ({number(stats['min'])}–{number(stats['max'])})"


def time_to_reward_cell(stats: dict[str, Any]) -> str:
    """A time-to-reward ratio as its headline, the seed-mean curves' ratio, with every seed's beside it: a
    censored seed (one that never reached the target) as the upper bound its run's length gives, ``≤``."""
    mean = ("≤ " if stats["mean_over_seeds_censored"] else "") + number(stats["mean_over_seeds"])
    seeds = ", ".join(
        ("≤ " if censored else "") + number(ratio)
        for ratio, censored in zip(stats["runs"], stats["censored"], strict=True)
    )
    return (
        f"{mean} on the seed-mean curves; per seed {seeds} ({stats['reached']} of {stats['seeds']} reached)"
    )


def load(name: str, results_dir: Path) -> dict[str, Any] | str:
    """``bench/results/NAME.json`` checked against the schema, or the note a block shows in its place."""
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
    return result


def render(name: str, results_dir: Path) -> str:
    """The markdown for one block: a whole result (``NAME``) or one of its studies (``NAME:STUDY``); the
    ``headlines`` block (every benchmark's headline, from bench/registry.py) and the ``run_all`` block (the
    last all-benchmarks run and its regression check) are built from several results."""
    if name in ASSEMBLED:
        return ASSEMBLED[name](results_dir)
    if name.startswith("family:"):  # atop a family's page: its headlines and its results
        return family(results_dir, name.partition(":")[2])
    result_name, _, study = name.partition(":")
    result = load(result_name, results_dir)
    if isinstance(result, str):
        return result
    if study:
        return render_study(result, result_name, study)
    machine = result["machine"]
    gpu = f"{machine['gpu']} with " if machine.get("gpu") else ""
    lines = [
        f"Measured at commit {commit_label(result['commit'])} on {gpu}{' and '.join(measured_on(result))} ({machine['cores']} cores, "
        f"{machine['torch_threads']} torch threads, torch {machine['torch']}), {result['repeats']} interleaved "
        f"repeats per arm{' (--quick: a smoke run, not a result)' if result['quick'] else ''}; "
        f"median (min–max). Command: `{result['command']}`.",
        "",
    ]
    if "studies" in result:
        lines += studies_index(result)
    elif "points" in result:
        lines += points_table(result)
    else:
        lines += [*arms_table(result["arms"]), *ratios_table(result["ratios"])]
    lines += derived_rows(result)
    if result_name in RUN_METRICS:
        lines += run_metric_rows(result, *RUN_METRICS[result_name])
    lines += render_table(result.get("table"))
    if "memory" in result:
        memory = result["memory"]
        lines.append(
            f"\nPeak memory: {number(memory['process_peak_rss_mb'])} MB in the benchmark's process, "
            f"at most {number(memory['largest_child_peak_rss_mb'])} MB in the largest process it started (Linux counts a "
            "child's peak from its fork, its parent's memory included)."
        )
    lines.append(f"\nResources: `{json.dumps(result['resources'])}`.")
    if result.get("setup"):  # the workload's shape and one-off costs (e.g. a backend's start-up), as recorded
        lines.append(f"\nSetup: `{json.dumps(result['setup'])}`.")
    return "\n".join(lines) + "\n"


def ratios_table(ratios: dict[str, Any], prefix: str = "") -> list[str]:
    """The paired ratios as rows, their arms' ``prefix`` dropped; a column of the reference figures when any
    ratio carries one (``report``: quoted from a paper, not measured)."""
    if not ratios:
        return []
    quoted = any("report" in stats for stats in ratios.values())
    lines = [
        "",
        "| ratio (per paired repeat) | median (min–max) |" + (" report (quoted) |" if quoted else ""),
    ]
    lines.append("|---|---:|" + ("---|" if quoted else ""))
    for key, stats in ratios.items():
        arms = f"{stats['numerator'].removeprefix(prefix)} / {stats['denominator'].removeprefix(prefix)}"
        row = f"| {key.removeprefix(prefix)}: {arms} {stats['metric']} | {spread(stats)} |"
        lines.append(row + (f" {stats.get('report', '—')} |" if quoted else ""))
    return lines


def points_table(result: dict[str, Any]) -> list[str]:
    """A reproduction of a paper's figures (``bench/paper_tables.py``): one row per claim, the reported ratio
    beside the predicted one over the seeds, whether it is within the tolerance; then the count, what each
    figure's best arm was where the paper names one, and the choices every figure shares. The arms are in the
    JSON (too many to show)."""
    share = result["within_tolerance"]
    lines = [
        "| figure | setting | reported | predicted, median (min–max) | within ±{:.0%} |".format(
            share["tolerance"]
        ),
        "|---|---|---:|---:|:---:|",
    ]
    for point in result["points"]:
        figure = point["figure"].split(":")[0]
        mark = "yes" if point["within_tolerance"] else "**no**"
        lines.append(
            f"| {figure} | {point['setting']} | {number(point['reported'])} | {spread(point['predicted'])} | {mark} |"
        )
    lines.append(
        f"\n{share['count']} of {share['of']} predictions within ±{share['tolerance']:.0%} of the report."
    )
    for name, figure in result["figures"].items():
        if "best" in figure:
            best = figure["best"]
            verdict = "agrees" if best["agrees"] else "disagrees"
            lines.append(
                f"\n{name}: the best arm per seed is {', '.join(best['predicted_per_seed'])}; the report's is "
                f"{best['reported']} ({verdict})."
            )
    walls = ", ".join(f"{name} {number(figure['wall_s'])} s" for name, figure in result["figures"].items())
    lines.append(f"\nWall time per figure: {walls}; the whole run {number(result['run_wall_s'])} s.")
    lines += ["", "Choices shared by every figure:", "", *(f"- {choice}" for choice in result["choices"])]
    return lines


def studies_index(result: dict[str, Any]) -> list[str]:
    """One row per study of a many-study result (each study's table is its own ``NAME:STUDY`` block), and
    the whole run's wall time when the result records it (``run_wall_s``)."""
    lines = ["| study | what | points | steps | wall (s) |", "|---|---|---:|---:|---:|"]
    lines += [
        f"| {name} | {s['title']} | {len(s['points'])} | {s['steps']} | {number(s['wall_s'])} |"
        for name, s in result["studies"].items()
    ]
    if "run_wall_s" in result:
        lines.append(f"\nThe whole run: {number(result['run_wall_s'])} s of wall time.")
    return lines


def render_study(result: dict[str, Any], name: str, study_name: str) -> str:
    """One study's block: its arms (one row per point), its paired ratios beside the reference figures, what
    it derived, and the reference finding that is not one ratio. A study that records its own commit and command
    (a continued run's stages may come from two) is labelled with those."""
    study = result.get("studies", {}).get(study_name)
    if study is None:
        return f"_`bench/results/{name}.json` has no study `{study_name}`: run `python bench/{name}.py`._\n"
    prefix = f"{study_name}/"
    arms = {
        arm.removeprefix(prefix): stats for arm, stats in result["arms"].items() if arm.startswith(prefix)
    }
    # a study's ratios are named `STUDY/...`, or `STUDY_..._over_...` where the name must be one key of the JSON
    ratios = {
        key: stats for key, stats in result["ratios"].items() if key.startswith((prefix, f"{study_name}_"))
    }
    verb, repeats = (
        ("Measured", study["repeats_note"])
        if "repeats_note" in study
        else (
            "Simulated",
            f"{result['repeats']} seeds per point (repeat i is seed i), median (min–max) over the seeds",
        )
    )
    lines = [
        f"{verb} at commit {commit_label(study.get('commit', result['commit']))} "
        f"by `{study.get('run_command', result['command'])}` "
        f"({number(study['wall_s'])} s of wall time for this study on {' and '.join(study_cpus(study, result))}): "
        f"{study['steps']} steps per point, {repeats}{' (--quick: a smoke run, not a result)' if result['quick'] else ''}"
        f"{'; stopped before its last point (continue it with --extend)' if study.get('finished') is False else ''}. "
        f"By hand: `{study['command']}`.",
        "",
        *arms_table(arms, wide_from=1),
        *ratios_table(ratios, prefix),
    ]
    if study.get("derived"):
        lines += ["", "| derived | value |", "|---|---:|"]
        lines += [f"| {key} | {cell(value)} |" for key, value in study["derived"].items()]
    if study.get("report"):
        lines.append(f"\nROLL Flash report (quoted from the paper, not measured here): {study['report']}.")
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
STANDARD_KEYS |= {"arms", "ratios", "table", "memory", "timelines"}


def derived_rows(result: dict[str, Any]) -> list[str]:
    """What a benchmark derived beyond its arms (bounds, ceilings, targets): every summary (``min``/``median``/
    ``max``) and every yes/no target found under its extra keys, as one more table."""
    rows: list[str] = []

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict) and {"min", "median", "max"} <= set(value):
            rows.append(f"| {path} | {spread(value)} |")
        elif isinstance(value, str) and path.endswith("edge"):  # a sweep whose best sits at its edge
            rows.append(f"| {path} | {value} |")
        elif isinstance(value, bool) and path.endswith("censored"):  # a time to reward's, not a target
            rows.append(f"| {path} | {'censored: never reached' if value else 'reached'} |")
        elif isinstance(value, bool):
            rows.append(f"| {path} | {'met' if value else 'not met'} |")
        elif isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{path} / {key}" if path else key, inner)

    for key, value in result.items():
        if key not in STANDARD_KEYS:
            walk(key, value)
    return ["", "| derived | median (min–max) |", "|---|---:|", *rows] if rows else []


RUN_METRICS = {
    "offpolicy": (
        ("loss", "setting"),
        "dropped_fraction",
        "share of tokens (of sequences, for `k3_rs`) the loss's correction dropped, mean over steps",
    )
}
"""Metrics a benchmark records per run but does not summarise per arm, which its reading relies on: the run
rows' key fields naming the arm, the metric, and what it means."""


def run_metric_rows(
    result: dict[str, Any], arm_keys: tuple[str, ...], metric: str, meaning: str
) -> list[str]:
    """One metric of a result's per-run rows as median (min–max) per arm, for the arms that record it."""
    values: dict[str, list[float]] = {}
    for row in result.get("runs", []):
        if row.get(metric) is not None:
            values.setdefault("/".join(str(row[k]) for k in arm_keys), []).append(row[metric])
    if not values:
        return []
    lines = ["", f"| arm | {metric}: {meaning} |", "|---|---:|"]
    for arm, runs in values.items():
        stats = {"min": min(runs), "median": statistics.median(runs), "max": max(runs)}
        lines.append(f"| {arm} | {spread(stats)} ({len(runs)} runs) |")
    return lines


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


def arms_table(arms: dict[str, dict[str, Any]], wide_from: int = WIDE_FROM_ARMS) -> list[str]:
    """The arms' metrics as markdown rows: one row per (arm, metric), or one per arm when ``wide_from`` or
    more arms share the same metrics (a sweep), so the table stays readable."""
    metrics = list(next(iter(arms.values())))
    if len(arms) >= wide_from and all(list(m) == metrics for m in arms.values()):
        lines = ["| arm | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
        return lines + [
            f"| {arm} | " + " | ".join(spread(stats[m]) for m in metrics) + " |"
            for arm, stats in arms.items()
        ]
    lines = ["| arm | metric | median (min–max) |", "|-----|--------|-----------------:|"]
    for arm, stats in arms.items():
        lines += [f"| {arm} | {metric} | {spread(values)} |" for metric, values in stats.items()]
    return lines


PAGES = ROOT / "docs/benchmarks"
"""One page per family of benchmarks; docs/benchmarks.md is their front page."""


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section_page(section: str, pages: Path = PAGES) -> str | None:
    """The family page (its file's stem) holding the heading whose anchor is ``section``."""
    for page in sorted(pages.glob("*.md")):
        if any(
            slug(line.lstrip("#")) == section
            for line in page.read_text().splitlines()
            if line.startswith("#")
        ):
            return page.stem
    return None


def headlines(results_dir: Path, family: str = "") -> str:
    """One row per headline of bench/registry.py: what is compared, on what, median (min–max) over paired
    repeats, the commits it was measured at (a continued run's stages may name several), and a link to its
    section: on its family's page from the front page; with ``family`` (a page's stem, ``_`` for ``-``) only
    that family's headlines, linked within its page."""
    lines = [
        "| compared | workload and resources | median (min–max) | commit | section |",
        "|---|---|---:|---|---|",
    ]
    for benchmark in BENCHMARKS:
        for headline in benchmark.headlines:
            page = section_page(headline.section)
            if family and page != family.replace("_", "-"):
                continue
            link = (
                f"#{headline.section}"
                if family or page is None
                else f"benchmarks/{page}.md#{headline.section}"
            )
            result = load(benchmark.result, results_dir)
            stats = result.get("ratios", {}).get(headline.ratio) if isinstance(result, dict) else None
            measured = (
                (spread(stats), ", ".join(commit_label(c) for c in measured_at(result)))
                if stats
                else (f"not measured yet: `python {' '.join(benchmark.args)}`", "—")
            )
            lines.append(
                f"| {headline.compared} | {headline.workload} | {measured[0]} | {measured[1]} | "
                f"[details]({link}) |"
            )
    return "\n".join(lines) + "\n"


def family(results_dir: Path, name: str) -> str:
    """The small table atop a family's page (``name``: its stem, ``_`` for ``-``): its headlines, if any, then
    each result quoted on the page with the commits and CPUs it was measured at and its repeats."""
    page = PAGES / f"{name.replace('_', '-')}.md"
    quoted = dict.fromkeys(
        m.group("name").partition(":")[0]
        for m in BLOCK.finditer(page.read_text() if page.exists() else "")
        if not m.group("name").startswith("family:")
    )
    rows = ["| result | measured at | on | repeats |", "|---|---|---|---:|"]
    for result_name in quoted:
        result = load(result_name, results_dir)
        if isinstance(result, str):
            rows.append(f"| `{result_name}` | not measured yet | — | — |")
            continue
        commits = ", ".join(commit_label(c) for c in measured_at(result))
        quick = " (--quick)" if result["quick"] else ""
        rows.append(
            f"| `{result_name}` | {commits} | {', '.join(measured_on(result))} | {result['repeats']}{quick} |"
        )
    table = headlines(results_dir, name)
    return (table + "\n" if table.count("\n") > 2 else "") + "\n".join(rows) + "\n"


def run_all_summary(results_dir: Path) -> str:
    """The last ``bench/run_all.py``: its commit and cost, each benchmark's wall-clock and status, and the
    metrics whose spread no longer overlaps the previous result's (the regression check)."""
    path = results_dir / "run_all.json"
    if not path.exists():
        return "_No all-benchmarks run yet: `python bench/run_all.py` writes `bench/results/run_all.json`._\n"
    summary = json.loads(path.read_text())
    lines = [
        f"`python bench/run_all.py` from commit {commit_label(summary['base'])} "
        f"over {len(summary['sessions'])} session(s), the last at {commit_label(summary['commit'])}: "
        f"{number(summary['wall_min'])} min of measurement (expected {number(summary['expected_min'])}); every "
        "result below was measured on the code of the last (a kept one's measured paths are unchanged since).",
        "",
        "| benchmark | wall (min) | status | measured at | CPU | metrics compared | beyond the spread | previous commit |",
        "|---|---:|---|---|---|---:|---:|---|",
    ]
    flagged_rows, cpus = [], set()
    for name, record in summary["benchmarks"].items():
        check = record.get("regression", {})
        previous = check.get("previous_commit")
        measured = ", ".join(commit_label(c) for c in record.get("measured_at", [])) or "—"
        if record.get("measured_apart"):
            measured += " (apart from run_all)"
        result = load(name, results_dir)
        on = measured_on(result) if isinstance(result, dict) else []
        cpus.update(on)
        lines.append(
            f"| {name} | {number(record['wall_min'])} | {'ok' if record['exit_status'] == 0 else 'failed'} | "
            f"{measured} | {', '.join(on) or '—'} | {check.get('compared', '—')} | {len(check.get('flagged', []))} | "
            f"{commit_label(previous) if previous else '—'} |"
        )
        for flag in check.get("flagged", []):
            before, after = (" / ".join(number(v) for v in flag[key]) for key in ("before", "after"))
            change = number(flag["change"]) if flag["change"] is not None else "—"
            flagged_rows.append(f"| {name} | {flag['metric']} | {before} | {after} | {change} |")
    if len(cpus) > 1:
        lines += [
            "",
            f"The series spans {len(cpus)} CPUs ({', '.join(sorted(cpus))}): a session's machine is not chosen. "
            "A ratio is paired within one run and holds on its CPU; absolute rates, and the regression check "
            "against results measured on another CPU, compare machines as much as code.",
        ]
    if summary.get("missing"):
        missing = ", ".join(summary["missing"])
        lines += ["", f"Not yet measured on this code ({len(summary['missing'])}): {missing}."]
    if flagged_rows:
        lines += [
            "",
            "Beyond the spread (min / median / max before and after; change = median ratio):",
            "",
            "| benchmark | metric | before | after | change |",
            "|---|---|---|---|---:|",
            *flagged_rows,
        ]
    return "\n".join(lines) + "\n"


ASSEMBLED = {"headlines": headlines, "run_all": run_all_summary}
"""Blocks built from several results rather than one."""


def regenerate(text: str, results_dir: Path) -> str:
    """``text`` with every bench block's body rebuilt from the results."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name"), results_dir) + m.group(4), text)


def doc_files() -> list[Path]:
    """Every file that may hold a block: README.md, docs/*.md and the benchmark family pages (one without a block
    is left as it is)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(PAGES.glob("*.md"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the docs are not what the JSON says")
    parser.add_argument("--docs", nargs="*", help="files to rewrite (default: README.md and docs/*.md)")
    parser.add_argument("--results", default=str(ROOT / "bench/results"))
    args = parser.parse_args()
    stale = []
    for docs in [Path(p) for p in args.docs] if args.docs else doc_files():
        text = docs.read_text()
        fresh = regenerate(text, Path(args.results))
        if fresh != text:
            stale.append(str(docs))
            if not args.check:
                docs.write_text(fresh)
    if args.check and stale:
        sys.exit(f"{', '.join(stale)} out of sync with {args.results}: run python scripts/bench_docs.py")


if __name__ == "__main__":
    main()
