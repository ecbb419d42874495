"""Whether a result still describes the code and the machine: the files it depends on, unchanged since it
was measured, and the CPUs it was measured on.

Why a module of its own: a measurement longer than a working session (bench/long_tail.py's stages, the
all-benchmarks run) is continued in the next session rather than started again, and that is sound only while
the code it measured is byte for byte the same. bench/harness.py is itself measured code, so this check lives
apart from it: changing how results are checked must not make every result stale.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def code_changes_since(commit: str, paths: Sequence[str]) -> list[str] | None:
    """The files among ``paths`` that differ between ``commit`` and the working tree, committed or not; None
    where that cannot be told (``commit`` had uncommitted changes, or is unknown to this clone). A result
    measured at ``commit`` describes today's code exactly when this is empty."""
    if commit.endswith("+dirty"):
        return None
    changed = subprocess.run(
        ["git", "diff", "--name-only", commit, "--", *paths], capture_output=True, text=True, cwd=ROOT
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
