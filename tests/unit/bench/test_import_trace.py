"""scripts/import_trace.py: a traced run lists the project modules it and its child processes import, and
nothing it did not import."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.registry import Benchmark

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("import_trace", ROOT / "scripts/import_trace.py")
import_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_trace)

SCRIPT = """
import multiprocessing
import sys

import asyncrl.rle  # imported by the benchmark's own process


def child() -> None:
    import asyncrl.types  # imported only in a child process


if __name__ == "__main__":
    assert "--quick" in sys.argv
    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join()
    sys.exit(process.exitcode)
"""


def test_a_trace_lists_the_modules_of_the_run_and_its_children_and_nothing_else(tmp_path: Path) -> None:
    script = tmp_path / "fake_bench.py"
    script.write_text(SCRIPT)
    record = import_trace.trace(Benchmark("fake", (str(script),), 1), timeout_s=120)
    paths = set(record["paths"])
    assert {
        "asyncrl/rle.py",
        "asyncrl/types.py",
        "asyncrl/__init__.py",
        "pyproject.toml",
        str(script),
    } <= paths
    assert "asyncrl/engine/llm_engine.py" not in paths and not any(
        p.startswith("asyncrl/trainer/") for p in paths
    )
    assert record["processes"] >= 2  # the child's imports came from its own process
    assert any(p.startswith("asyncrl/examples/") for p in paths)  # data files a run reads are measured too


def test_a_failed_run_gives_no_trace(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit(3)\n")
    assert "exited 3" in import_trace.trace(Benchmark("broken", (str(script),), 1), timeout_s=60)["error"]


FAILING_CHILD = """
import subprocess
import sys

if __name__ == "__main__":
    child = subprocess.run([sys.executable, "-c", "raise RuntimeError('the real cause, in a child')"])
    for line in range(5):  # the parent's own lines after the child's traceback, as a benchmark logs them
        print(f"tidying up {line}", file=sys.stderr)
    raise SystemExit(f"the child failed (exit {child.returncode}): see above")
"""


def test_a_failed_run_shows_the_traceback_of_the_child_that_failed(tmp_path: Path) -> None:
    # weight_sync's --quick fails in a per-size child process and its own last line says only "see above"
    script = tmp_path / "child_fails.py"
    script.write_text(FAILING_CHILD)
    record = import_trace.trace(Benchmark("child_fails", (str(script),), 1), timeout_s=60)
    assert "exited 1" in record["error"]
    assert "RuntimeError: the real cause, in a child" in record["stderr"]
    assert record["stderr"].splitlines()[-1] == "the child failed (exit 1): see above"


def test_module_names_map_to_their_files() -> None:
    files = import_trace.module_files(["asyncrl", "asyncrl.rle", "asyncrl.no_such_module", "json"])
    assert files == {"asyncrl/__init__.py", "asyncrl/rle.py"}
