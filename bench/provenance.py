"""Whether a result still describes the code and the machine: the files it depends on, unchanged since it
was measured, and the CPUs it was measured on.

Why a module of its own: a measurement longer than a working session (bench/long_tail.py's stages, the
all-benchmarks run) is continued in the next session rather than started again, and that is sound only while
the code it measured is byte for byte the same. bench/harness.py is itself measured code, so this check lives
apart from it: changing how results are checked must not make every result stale.
"""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.registry import Benchmark

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "bench/imports.json"
"""Each benchmark's import trace (``scripts/import_trace.py``): the project files its ``--quick`` run imports."""


def load_traces(path: Path = TRACES) -> dict[str, Any]:
    """``bench/imports.json`` as stored (benchmark → its trace), empty where none was made yet."""
    return json.loads(path.read_text()) if path.exists() else {}


def measured_code(benchmark: Benchmark, traces: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The paths a benchmark's numbers depend on: what its traced run imports (its modules, its script,
    pyproject.toml, the package's data files) and its registered extras, less the paths it derives with only
    (``derived_only``). Without a trace, the whole package, its pins, its script and every bench module that
    script imports (followed through their imports). A result stays current while none of them changes."""
    trace = (load_traces() if traces is None else traces).get(benchmark.result)
    paths = trace["paths"] if trace else ["asyncrl", "pyproject.toml", *bench_imports(benchmark.args[0])]
    return tuple(
        p for p in dict.fromkeys([*paths, *benchmark.measured_code]) if p not in benchmark.derived_only
    )


def bench_imports(script: str) -> list[str]:
    """``script`` and every bench module it imports, followed through their imports (read, not run)."""
    seen: set[Path] = set()
    todo = [ROOT / script]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "bench":
                modules = [f"bench.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            todo += [ROOT / f"{m.replace('.', '/')}.py" for m in modules if m.startswith("bench.")]
    return sorted(str(p.relative_to(ROOT)) for p in seen)


def code_changes_since(commit: str, paths: Sequence[str], root: Path = ROOT) -> list[str] | None:
    """The files among ``paths`` that differ between ``commit`` and the working tree, committed or not; None
    where that cannot be told (``commit`` had uncommitted changes, or is unknown to this clone). A result
    measured at ``commit`` describes today's code exactly when this is empty."""
    if commit.endswith("+dirty"):
        return None
    changed = subprocess.run(
        ["git", "diff", "--name-only", commit, "--", *paths], capture_output=True, text=True, cwd=root
    )
    return changed.stdout.split() if changed.returncode == 0 else None


def measured_at(result: Mapping[str, Any]) -> list[str]:
    """Every commit a result's numbers come from: its own, and its stages' where a continued run recorded
    each (bench/long_tail.py --extend: the result's own commit is then the last invocation's)."""
    studies = result.get("studies", {}).values()
    return sorted(
        {result["commit"], *(s["commit"] for s in studies if isinstance(s, dict) and "commit" in s)}
    )


def measured_on(result: Mapping[str, Any]) -> list[str]:
    """The CPUs a result was measured on: its machine's, or each study's where a continued run's stages say
    (a later session may run on another machine)."""
    studies = result.get("studies") or {"": {}}
    return sorted({cpu for study in studies.values() for cpu in study_cpus(study, result)})


def study_cpus(study: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """The CPUs one study ran on: each point's where it records them (a curve continued on another machine),
    else the study's, else the result's machine."""
    points = study.get("point_provenance", {}).values()
    return sorted(
        {p["cpu_model"] for p in points} or {study.get("cpu_model", result["machine"]["cpu_model"])}
    )
