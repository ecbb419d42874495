"""Which of the project's files a benchmark's run imports: the paths its result depends on.

Why traced, not listed: a result stays current while the code it measured is unchanged (``bench/run_all.py
--continue``, ``bench/long_tail.py --extend``). Counting the whole package as that code sent every benchmark,
about thirteen hours of this machine, back to the list on any change to the package; a hand-written list
drifts from what the run really uses. So each benchmark's ``--quick`` run is traced: an audit hook records
every ``asyncrl`` and ``bench`` module imported, in the benchmark's process and in every Python process it
starts (child processes, Ray workers: the hook is a ``sitecustomize`` on ``PYTHONPATH``, which they inherit,
and a forked child keeps it). The modules' files, the script, ``pyproject.toml`` and every data file under
``asyncrl/`` (configs, shipped weights: read, not imported) are the benchmark's measured paths, stored in
``bench/imports.json`` with the commit they were traced at.

What a trace cannot see: a module the full mode imports and the ``--quick`` mode does not (another runtime,
a backend): such a benchmark names it in its registry entry's ``measured_code``, added to the trace. A
benchmark without a trace keeps the whole package as its measured code.

    python scripts/import_trace.py [--only NAME ...]   # trace every registered benchmark's --quick run
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python scripts/import_trace.py` puts scripts/ first on sys.path: make the checkout the import root
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from typing import Any  # noqa: E402

from bench.harness import git_commit  # noqa: E402
from bench.provenance import TRACES, load_traces  # noqa: E402
from bench.registry import BENCHMARKS, Benchmark  # noqa: E402

STDERR_LINES = 120
"""How much of a failed run's stderr the trace shows: enough for a child process's traceback (a Ray error alone
runs to ~50 lines: its memory report) and the lines its parent printed after it."""
PREFIXES = ("asyncrl", "bench")
"""Top-level packages whose imported modules are the project's code."""
HOOK = '''"""Written by scripts/import_trace.py: records the project's modules this process imports."""
import os
import sys

_out = os.environ.get("ASYNCRL_IMPORT_TRACE")
if _out:
    _seen = set()

    def _record(event, args):
        if event != "import" or args[0] in _seen or args[0].partition(".")[0] not in {prefixes!r}:
            return
        _seen.add(args[0])
        with open(os.path.join(_out, f"{{os.getpid()}}.txt"), "a") as trace:
            trace.write(args[0] + "\\n")

    sys.addaudithook(_record)
'''


def module_files(names: Iterable[str], root: Path = ROOT) -> set[str]:
    """The repository files of dotted module names (a package is its ``__init__.py``); names with no file
    here (a namespace package, an import that failed) are left out."""
    files = set()
    for name in names:
        base = root / name.replace(".", "/")
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                files.add(str(candidate.relative_to(root)))
    return files


def data_files(root: Path = ROOT) -> list[str]:
    """Every tracked file under asyncrl/ that is not Python: configs and assets a run reads, never imports."""
    listed = subprocess.run(
        ["git", "ls-files", "asyncrl"], cwd=root, capture_output=True, text=True, check=True
    )
    return sorted(path for path in listed.stdout.split() if not path.endswith(".py"))


def stderr_tail(stderr: str | bytes | None, lines: int = STDERR_LINES) -> str:
    """The last ``lines`` lines of a failed run's stderr: its traceback, which a benchmark's own last line (a
    child process's "failed ...: see above") does not carry."""
    if isinstance(stderr, bytes):  # what a timed-out run had written (``TimeoutExpired`` keeps bytes)
        stderr = stderr.decode(errors="replace")
    return "\n".join((stderr or "").rstrip().splitlines()[-lines:])


def trace(benchmark: Benchmark, timeout_s: float) -> dict[str, Any]:
    """Run the benchmark's ``--quick`` mode under the hook; its measured paths, or why there are none."""
    with tempfile.TemporaryDirectory(prefix="import-trace-") as tmp:
        hook_dir, records = Path(tmp) / "hook", Path(tmp) / "records"
        hook_dir.mkdir()
        records.mkdir()
        (hook_dir / "sitecustomize.py").write_text(HOOK.format(prefixes=set(PREFIXES)))
        path = os.pathsep.join([str(hook_dir), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env = {**os.environ, "PYTHONPATH": path, "ASYNCRL_IMPORT_TRACE": str(records)}
        command = [sys.executable, *benchmark.args, "--quick", "--out", str(Path(tmp) / "result.json")]
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as expired:
            return {"error": f"--quick ran past {timeout_s:g} s", "stderr": stderr_tail(expired.stderr)}
        if done.returncode != 0:
            return {"error": f"--quick exited {done.returncode}", "stderr": stderr_tail(done.stderr)}
        names = {line for record in records.iterdir() for line in record.read_text().split()}
        processes = len(list(records.iterdir()))
    modules = module_files(names)
    return {
        "paths": sorted({"pyproject.toml", benchmark.args[0], *modules, *data_files()}),
        "modules": len(modules),
        "processes": processes,
        "quick_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [b.result for b in BENCHMARKS]
    parser.add_argument("--only", nargs="*", choices=names, help="trace only these (default: all)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per --quick run")
    args = parser.parse_args()
    traces = load_traces()
    commit = git_commit()
    for benchmark in BENCHMARKS:
        if args.only and benchmark.result not in args.only:
            continue
        print(f"tracing {benchmark.result}: python {' '.join(benchmark.args)} --quick", flush=True)
        record = trace(benchmark, args.timeout)
        if "error" in record:  # keep an earlier trace: a failed run says nothing about what it imports
            print(f"  {record['error']}; its stderr ends:", flush=True)
            print(textwrap.indent(record["stderr"] or "(empty)", "  | "), flush=True)
            continue
        print(f"  {record['modules']} modules", flush=True)
        traces[benchmark.result] = {
            "commit": commit,
            "command": " ".join(benchmark.args) + " --quick",
            **record,
        }
        TRACES.write_text(json.dumps(dict(sorted(traces.items())), indent=1) + "\n")


if __name__ == "__main__":
    main()
