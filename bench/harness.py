"""The one way every benchmark repeats, records and writes its numbers.

Why a shared harness: timings on a shared CPU box drift by tens of per cent from one minute to the next, so a
single run per arm, or all repeats of arm A before all of arm B, turns drift into a fake speedup. Here every
arm runs ``repeats`` times interleaved (A B A B …), every repeat is kept, each metric is reported as
``{"min", "median", "max", "runs"}``, and a ratio between two arms is computed per paired repeat (repeat i
of A over repeat i of B, taken minutes apart at most) and summarized the same way. The result JSON records
what is needed to reproduce it: the exact command, the git commit, the machine and how its cores were split.

A benchmark defines its arms as callables returning ``{metric: float}`` and calls :func:`run_arms`, then
:func:`write_result`. ``--quick`` (see :func:`parser`) is the smoke mode a test runs: seconds, tiny shapes,
written to a temporary directory, asserting only that the schema came out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.metrics.progress import library_bars_follow_terminal

SCHEMA_VERSION = 2
"""Bumped when the result layout changes; ``scripts/bench_docs.py`` only quotes files of this version."""
RESULTS_DIR = "bench/results"

Arm = Callable[[], Mapping[str, float]]
"""One arm of a benchmark: runs it once and returns its measured metrics (numbers only)."""


_start_threads: list[int] = []
"""torch's thread count when the benchmark started (``parser`` records it): what a user's process gets. Runs
may leave the main thread elsewhere (the inline runtime keeps it at 1), so the record states this one."""


_start_commit: list[str] = []
"""The commit when the benchmark started (``parser`` records it): a commit made while it runs (an hour-long
sweep) must not relabel what it measured."""


def parser(description: str, name: str, default_repeats: int = 3) -> argparse.ArgumentParser:
    """The flags every benchmark shares: ``--quick``, ``--repeats``, ``--out``."""
    import torch  # here, not at import: the harness itself is importable without torch

    library_bars_follow_terminal()  # a benchmark's log gets no carriage-return bars from the libraries
    _start_threads[:] = [torch.get_num_threads()]
    _start_commit[:] = [git_commit()]
    parsed = argparse.ArgumentParser(description=description)
    parsed.add_argument("--quick", action="store_true", help="smoke mode: seconds, tiny shapes, 1 repeat")
    parsed.add_argument(
        "--repeats", type=int, default=default_repeats, help="interleaved repeats per arm (>= 3 for a result)"
    )
    parsed.add_argument("--out", default=f"{RESULTS_DIR}/{name}.json", help="where the result JSON goes")
    return parsed


def repeats_for(args: argparse.Namespace) -> int:
    """One repeat in ``--quick`` (a smoke test), otherwise what was asked, refusing fewer than 3: a
    median of two runs says nothing about spread."""
    if args.quick:
        return 1
    if args.repeats < 3:
        raise SystemExit(f"--repeats must be >= 3 for a reportable result, got {args.repeats}")
    return args.repeats


def placement(config: Any) -> dict[str, Any]:
    """How a run's config (a ``RunConfig``) splits the cores, as its runtime plans it: threads and reserved CPUs
    per role. Taken from the planner, not described by hand, so a record cannot drift from what ran."""
    from asyncrl.runtime.placement import plan_placement

    plan = plan_placement(
        config.runtime,
        num_engines=config.rollout.num_engines,
        mode=config.controller.mode,
        async_ratio=config.buffer.async_ratio,
    )
    return {"runtime": config.runtime.type, **plan.describe()}


def summary(values: Sequence[float]) -> dict[str, Any]:
    """``{"min", "median", "max", "runs"}`` of one metric over repeats, every run kept in order."""
    if not values:
        raise ValueError("a metric needs at least one run")
    runs = [float(v) for v in values]
    return {"min": min(runs), "median": statistics.median(runs), "max": max(runs), "runs": runs}


def run_arms(
    arms: Mapping[str, Arm],
    repeats: int,
    on_run: Callable[[str, int, Mapping[str, float]], None] | None = None,
    *,
    warmup: bool = False,
) -> dict[str, list[dict[str, float]]]:
    """Every arm ``repeats`` times, interleaved (repeat 0 of every arm, then repeat 1, …); the raw runs per arm.

    The arm order also reverses each repeat (A B, B A, A B …) so no arm always runs first, right after a
    warm-up or right after a heavy sibling. ``warmup`` runs every arm once first, untimed and unrecorded
    (lazy initialisation, allocator growth, first-call kernel selection)."""
    names = list(arms)
    if warmup:
        for name in names:
            arms[name]()
    raw: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        for name in order:
            metrics = {key: float(value) for key, value in arms[name]().items()}
            raw[name].append(metrics)
            if on_run is not None:
                on_run(name, repeat, metrics)
    return raw


def print_run(arm: str, repeat: int, metrics: Mapping[str, float]) -> None:
    """The default ``on_run`` of :func:`run_arms`: one line per run, so a long benchmark shows progress."""
    print(arm, repeat, json.dumps(dict(metrics)), flush=True)


def summarize(raw: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per arm, per metric: :func:`summary` over the repeats."""
    return {
        arm: {metric: summary([run[metric] for run in runs]) for metric in runs[0]}
        for arm, runs in raw.items()
    }


def paired_ratio(
    raw: Mapping[str, Sequence[Mapping[str, float]]], numerator: str, denominator: str, metric: str
) -> dict[str, Any]:
    """``numerator / denominator`` of ``metric`` per paired repeat, summarized like any metric."""
    top, bottom = raw[numerator], raw[denominator]
    if len(top) != len(bottom):
        raise ValueError(f"{numerator} has {len(top)} runs, {denominator} {len(bottom)}: not paired")
    return {
        "numerator": numerator,
        "denominator": denominator,
        "metric": metric,
        **summary([a[metric] / b[metric] for a, b in zip(top, bottom, strict=True)]),
    }


def best_by_paired_ratio(
    raw: Mapping[str, Sequence[Mapping[str, float]]], candidates: Sequence[str], metric: str = "samples_per_s"
) -> dict[str, Any]:
    """The best of ``candidates`` (higher ``metric`` is better) by the paired ratio, and by how much.

    Why not the highest median: two arms a few per cent apart swap places from one repeat to the next, and a
    0.7 % median margin once chose a best sync that the paired ratio put 4 % behind its runner-up. Here each
    candidate's score is its smallest median paired ratio over every other candidate (above 1: it beats each
    of them in the median repeat); the best has the largest score. ``over_runner_up`` is its paired ratio over
    the candidate that comes closest, so a reader sees whether the choice is within the spread."""
    if not candidates:
        raise ValueError("best_by_paired_ratio needs at least one candidate")

    def median_over(numerator: str, denominator: str) -> float:
        return paired_ratio(raw, numerator, denominator, metric)["median"]

    def score(name: str) -> float:
        return min((median_over(name, other) for other in candidates if other != name), default=1.0)

    best = max(candidates, key=score)
    others = [name for name in candidates if name != best]
    record: dict[str, Any] = {
        "name": best,
        "chosen_by": f"paired ratio of {metric} over every other candidate",
    }
    if others:
        runner_up = min(others, key=lambda other: median_over(best, other))
        record |= {"runner_up": runner_up, "over_runner_up": paired_ratio(raw, best, runner_up, metric)}
    return record


def sweep_edge(axis: Mapping[str, float], best: str, what: str) -> str | None:
    """Where the best arm of a one-axis sweep (``axis``: arm → swept value) sits at the sweep's smallest or
    largest value, the sentence saying so: the optimum may lie beyond what was swept. None inside the sweep."""
    values = sorted(axis.values())
    if best not in axis or len(values) < 2 or values[0] < axis[best] < values[-1]:
        return None
    end = "largest" if axis[best] == values[-1] else "smallest"
    return f"the best {what} swept, {axis[best]:g}, is its {end} value: the sweep stops at its best, beyond it is not measured"


@dataclass(frozen=True)
class TimeToReward:
    """One seed's (or the seed-mean curve's) time to a target reward, for a ratio ``reference_s / reached_s``.

    ``reached_s`` is None when the measured run never reached the target: the seed is *censored*, its time
    at least ``run_s`` (the run's length, its last evaluation), so its ratio is an upper bound. Why kept, never
    dropped: the seed that misses the target is that arm's worst, and dropping it biases every summary."""

    reference_s: float
    """The reference arm's time (numerator of the ratio)."""
    reached_s: float | None
    """The measured arm's first time at the target (denominator), or None if it never got there."""
    run_s: float
    """The measured arm's run length: a censored seed's time is at least this."""

    @property
    def censored(self) -> bool:
        return self.reached_s is None

    @property
    def ratio(self) -> float:
        """reference over measured time; for a censored seed an upper bound (reference over run length)."""
        time = self.run_s if self.reached_s is None else self.reached_s
        if time <= 0:
            raise ValueError(f"time to reward of {time} s: a target met at the start measures nothing")
        return self.reference_s / time


TIME_TO_REWARD = "time_to_reward"
"""``kind`` of a ratio of times to a reward: :func:`check_schema` holds every such ratio to one run per seed."""


def time_to_reward_ratio(
    numerator: str, denominator: str, metric: str, seeds: Sequence[TimeToReward], mean: TimeToReward
) -> dict[str, Any]:
    """A time-to-reward ratio that never drops a seed: every seed's ratio in ``runs`` (a censored one as its
    upper bound, flagged in ``censored``), ``reached`` of ``seeds`` saying how many got there, and the headline
    ``mean_over_seeds``: the ratio read off the seed-mean curves (one noisy evaluation per checkpoint averages
    out over seeds), itself censored when the mean curve never reaches the target."""
    if not seeds:
        raise ValueError("a time-to-reward ratio needs at least one seed")
    censored = [seed.censored for seed in seeds]
    return {
        "numerator": numerator,
        "denominator": denominator,
        "metric": metric,
        "kind": TIME_TO_REWARD,
        "seeds": len(seeds),
        "reached": censored.count(False),
        "censored": censored,
        "mean_over_seeds": mean.ratio,
        "mean_over_seeds_censored": mean.censored,
        **summary([seed.ratio for seed in seeds]),
    }


def check_time_to_reward(key: str, stats: Mapping[str, Any], repeats: int) -> None:
    """Raise ``ValueError`` unless a time-to-reward ratio keeps one run per seed (``repeats`` of them), each
    flagged censored or not, and carries its seed-mean headline. A ratio whose metric mentions a reward but
    was not built by :func:`time_to_reward_ratio` is refused: it could have dropped a seed."""
    if stats.get("kind") != TIME_TO_REWARD:
        raise ValueError(f"ratios.{key} times a reward but was not built by harness.time_to_reward_ratio")
    runs, censored = stats["runs"], stats.get("censored", [])
    if len(runs) != repeats or len(censored) != repeats or stats.get("seeds") != repeats:
        raise ValueError(
            f"ratios.{key} has {len(runs)} runs ({len(censored)} flagged) for {repeats} seeds: a seed was dropped"
        )
    if stats.get("reached") != censored.count(False) or "mean_over_seeds" not in stats:
        raise ValueError(f"ratios.{key} lacks its reached count or its seed-mean headline")


def git_commit() -> str:
    """The commit the benchmark ran at, ``+dirty`` when the tree had uncommitted changes to anything but
    ``bench/results`` (result files are outputs: one benchmark's fresh result must not mark the next one's
    code as changed).

    ``ASYNCRL_BENCH_COMMIT``, when set, is taken as is: a tree copied to another machine (a lent GPU machine)
    may arrive with a stale ``.git`` beside it, whose HEAD and status describe some other tree."""
    if os.environ.get("ASYNCRL_BENCH_COMMIT"):
        return os.environ["ASYNCRL_BENCH_COMMIT"]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", f":(exclude){RESULTS_DIR}"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def run_commit() -> str:
    """The commit the benchmark's code was at when it started (``parser``), else ``git_commit()`` now."""
    return _start_commit[0] if _start_commit else git_commit()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Cores, threads, libraries and load: what makes two results comparable or not."""
    import torch  # here, not at import: the harness itself is importable without torch

    library_bars_follow_terminal()  # a benchmark's log gets no carriage-return bars from the libraries
    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": _start_threads[0] if _start_threads else torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def resident_memory_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak (``VmRSS``, ``VmHWM``), in MB.

    Why not ``getrusage``: Linux carries ``ru_maxrss`` across ``execve``, so a child started by a large parent
    reports the parent's resident size at fork as its own peak (two arms of ``bench/lora.py`` once read the same
    2,835 MB). ``VmHWM`` belongs to the process's own address space, which ``execve`` replaces."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss_mb": fields.get("VmRSS", float("nan")), "peak_rss_mb": fields.get("VmHWM", float("nan"))}


def peak_memory() -> dict[str, float]:
    """Peak resident memory, in MB, of this benchmark process and a ceiling on that of the processes it started
    and waited for (``RUSAGE_CHILDREN``: a run in a child process, a worker). The children's figure is only a
    ceiling: Linux counts a child's peak from its fork, the parent's resident memory at that moment included
    (see :func:`resident_memory_mb`). Where roles live in separate processes the benchmark records each role's
    own (``bench/cpu_use.py``, ``bench/long_tail.py``'s lone roles, ``bench/lora.py``'s trainers)."""
    import resource  # here: Unix only, and only when a result is written

    return {
        "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "largest_child_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def write_result(
    args: argparse.Namespace,
    name: str,
    raw: Mapping[str, Sequence[Mapping[str, float]]],
    *,
    ratios: Mapping[str, dict[str, Any]] | None = None,
    resources: Mapping[str, Any],
    setup: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``args.out`` in the shared schema and return it.

    ``resources`` says how cores were split per arm (e.g. ``{"sync": {"threads": 2}, "async": {"engine_cores":
    [0], "trainer_cores": [1]}}``): a number is meaningless without it. ``setup`` is the workload's shape;
    ``extra`` holds anything benchmark-specific that is not a repeated metric (targets, derived bounds)."""
    result = {
        "schema": SCHEMA_VERSION,
        "benchmark": name,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": run_commit(),
        "quick": bool(args.quick),
        "repeats": len(next(iter(raw.values()))),
        "machine": machine(),
        "memory": peak_memory(),
        "resources": dict(resources),
        "setup": dict(setup or {}),
        "arms": summarize(raw),
        "ratios": dict(ratios or {}),
        **dict(extra or {}),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def check_schema(result: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first field that does not follow the schema (used by tests and docs)."""
    for key in (
        "schema",
        "benchmark",
        "command",
        "commit",
        "machine",
        "resources",
        "arms",
        "ratios",
        "repeats",
    ):
        if key not in result:
            raise ValueError(f"result lacks {key!r}")
    if result["schema"] != SCHEMA_VERSION:
        raise ValueError(f"schema {result['schema']} is not {SCHEMA_VERSION}")
    for arm, metrics in {**result["arms"], **{"ratios": result["ratios"]}}.items():
        for metric, stats in metrics.items():
            missing = {"min", "median", "max", "runs"} - set(stats)
            if missing:
                raise ValueError(f"{arm}.{metric} lacks {sorted(missing)}")
    for key, stats in result["ratios"].items():
        if times_a_reward(stats):
            check_time_to_reward(key, stats, result["repeats"])


def times_a_reward(stats: Mapping[str, Any]) -> bool:
    """Whether a ratio compares times to a reward: built as one, or its metric says so (a throughput ratio of
    a time-to-reward stage, ``time_to_reward_samples_per_s_...``, is not one)."""
    metric = str(stats.get("metric", ""))
    return stats.get("kind") == TIME_TO_REWARD or (
        "reward" in metric and re.search(r"\btime to\b|\bs to\b", metric) is not None
    )
