"""Every ``python bench/...`` and ``python scripts/...`` command the docs show starts as written, from the
checkout's root after the README's install, with no ``PYTHONPATH`` (the ``user_env`` fixture).

Starting is checked here for every documented script at once (``start_scripts.py``: each script's top-level
imports run as ``python SCRIPT --help`` runs them, in one process, so the check costs one import of torch). The
benchmarks' ``--quick`` runs, marked ``slow``, run each ``python bench/NAME.py --quick`` to the end the same
way; this module checks that every documented benchmark has one. Shell scripts are left out: each needs an
environment the install does not give (vLLM, CUDA) and sets its own paths.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from test_bench_quick import QUICK

ROOT = Path(__file__).resolve().parents[3]
COMMAND = re.compile(r"\bpython3? ((?:bench|scripts)/[\w-]+\.py)")
"""A documented command: ``python bench/engine.py ...`` or ``python3 scripts/check_headroom.py ...``."""
QUICK_ELSEWHERE = re.compile(r'"(bench/[\w-]+\.py)", "--quick"')
"""A test (outside ``test_bench_quick``) that runs a benchmark's quick mode and checks what it wrote."""


def documented_commands() -> dict[str, list[str]]:
    """Script path → the files that show a command running it (docs, model cards, usage lines)."""
    texts = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "asyncrl").rglob("*.md")),
        *sorted((ROOT / "asyncrl").rglob("*.py")),
        *sorted((ROOT / "bench").glob("*.py")),
        *sorted((ROOT / "scripts").glob("*.py")),
    ]
    found: dict[str, list[str]] = {}
    for path in texts:
        for script in COMMAND.findall(path.read_text()):
            found.setdefault(script, []).append(str(path.relative_to(ROOT)))
    return found


def test_the_docs_show_commands_to_check():
    documented = documented_commands()
    assert "bench/engine.py" in documented and "scripts/bench_docs.py" in documented
    assert all((ROOT / script).is_file() for script in documented), "a documented script does not exist"


def test_every_documented_script_starts_as_written_without_pythonpath(user_env):
    checker = Path(__file__).with_name("start_scripts.py")
    command = [sys.executable, str(checker), *sorted(documented_commands())]
    done = subprocess.run(command, cwd=ROOT, env=user_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def quick_runs_in_tests() -> set[str]:
    """Benchmarks some test runs as ``python bench/NAME.py --quick`` with ``env=user_env`` (no PYTHONPATH)."""
    found = {f"bench/{name}.py" for name in QUICK}
    for path in (ROOT / "tests").rglob("test_*.py"):
        text = path.read_text()
        if "env=user_env" in text:
            found |= set(QUICK_ELSEWHERE.findall(text))
    return found


def test_every_documented_benchmark_has_a_quick_run_started_as_a_user_would():
    documented = {script for script in documented_commands() if script.startswith("bench/")}
    missing = documented - quick_runs_in_tests()
    assert missing == set(), "documented, never run by a test: give it a --quick run"


def test_a_script_imported_as_a_module_leaves_sys_path_alone():
    """A script puts the checkout first on ``sys.path`` only when run as one: tests import some scripts
    (``bench_docs``, ``recipe_plans``) as modules, and a rewritten ``sys.path[0]`` there once dropped a test
    folder that later tests' spawned children needed to import their test module."""
    before = list(sys.path)
    spec = importlib.util.spec_from_file_location(
        "recipe_plans_import_check", ROOT / "scripts/recipe_plans.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert sys.path == before
