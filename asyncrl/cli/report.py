"""``asyncrl report RUN_DIR [RUN_DIR ...]``: charts and one self-contained HTML page of runs, overlaid."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="charts and an HTML page of one or more runs (real or simulated)",
        description=(
            "Reads each run directory (asyncrl train: metrics.jsonl, summary.json, timeline.jsonl; asyncrl "
            "simulate: steps.jsonl, result.json, timeline.jsonl) and writes OUT/*.png and OUT/index.html: "
            "reward vs step and wall-clock, response length, staleness histogram, buffer occupancy, and each "
            "run's Gantt timeline with the idle fraction of every role."
        ),
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to compare")
    parser.add_argument("--out", default="runs/report", help="output directory (default runs/report)")
    parser.add_argument("--title", default="asyncrl report", help="title of the HTML page")


def run(args: argparse.Namespace) -> int:
    from asyncrl.metrics.report import write_report

    page = write_report(args.run_dirs, args.out, title=args.title)
    print(f"report: {page}")
    return 0
