"""Every ``python bench/...`` and ``python scripts/...`` command the docs show starts as written, from the
checkout's root after the README's install, with no ``PYTHONPATH`` (the ``user_env`` fixture).

The benchmarks' ``--quick`` runs are the proof for ``bench/``: each runs exactly ``python bench/NAME.py --quick``
(plus ``--out``) without ``PYTHONPATH``; this module only checks that every documented benchmark has one. The
helper scripts are started here (``--help``: it imports what the script needs at the top). Shell scripts are
left out: each needs an environment the install does not give (vLLM, CUDA) and sets its own paths.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench_quick import QUICK

ROOT = Path(__file__).resolve().parents[3]
COMMAND = re.compile(r"\bpython3? ((?:bench|scripts)/[\w-]+\.py)")
"""A documented command: ``python bench/engine.py ...`` or ``python3 scripts/check_headroom.py ...``."""
QUICK_ELSEWHERE = {
    "bench/agentic.py": "tests/integration/test_bench_agentic.py",
    "bench/soak.py": "tests/integration/test_bench_soak.py",
    "bench/long_tail.py": "tests/integration/test_bench_long_tail.py",
    "bench/run_all.py": "tests/unit/bench/test_run_all.py",
    "bench/serve_load.py": "tests/integration/test_bench_serve_load.py",
}
"""Benchmarks whose ``--quick`` run lives in an integration test that also checks what it wrote."""
HELPERS = ("scripts/bench_docs.py", "scripts/check_headroom.py", "scripts/recipe_plans.py")


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


def test_every_documented_benchmark_has_a_quick_run_started_as_a_user_would():
    documented = {script for script in documented_commands() if script.startswith("bench/")}
    started = {f"bench/{name}.py" for name in QUICK} | set(QUICK_ELSEWHERE)
    assert documented - started == set(), "documented, never started by a test: give it a --quick run"
    for script, test in QUICK_ELSEWHERE.items():
        text = (ROOT / test).read_text()
        assert f'"{script}", "--quick"' in text and "env=user_env" in text, test


def test_every_documented_helper_script_is_started_here():
    documented = {script for script in documented_commands() if script.startswith("scripts/")}
    assert documented <= set(HELPERS), "a documented script this module does not start"


@pytest.mark.parametrize("script", HELPERS)
def test_a_helper_script_starts_without_pythonpath(script: str, user_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, env=user_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")
