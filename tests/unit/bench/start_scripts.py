"""Start each script given as ``python SCRIPT --help`` would start it, all in this one process.

Run it as ``python start_scripts.py SCRIPT...`` from the checkout's root with no ``PYTHONPATH``. For each
script, sys.path is what Python gives a script (its own folder first, then the installation's paths; no folder
of the checkout, this one's included), every module loaded from bench/ or scripts/ is forgotten, and the
script runs as ``__main__`` up to its ``--help`` exit: every top-level import of it must resolve. Libraries
stay imported between scripts, so the whole check costs one import of torch, not one per script. Prints one
line per script that failed to start and exits 1 if any did.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

CHECKOUT = Path.cwd().resolve()
FOLDERS = (CHECKOUT / "bench", CHECKOUT / "scripts")


def forget_checkout_modules() -> None:
    """Drop every module loaded from bench/ or scripts/ (and the ``bench`` namespace package itself)."""
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])), None)
        if where and any(Path(where).resolve().is_relative_to(folder) for folder in FOLDERS):
            del sys.modules[name]


def start(script: Path, installed_paths: list[str]) -> str | None:
    """None if ``script --help`` exits 0, else why it did not start."""
    forget_checkout_modules()
    sys.path[:] = [str(script.parent), *installed_paths]
    sys.argv = [str(script), "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        return None if stop.code in (0, None) else f"exited with {stop.code}"
    except Exception as error:  # deliberate: report every script's failure, not only the first
        return f"{type(error).__name__}: {error}"
    return "ran to the end without exiting on --help"


def main(scripts: list[str]) -> int:
    installed = [
        p for p in sys.path if p and not (Path(p).is_dir() and Path(p).resolve().is_relative_to(CHECKOUT))
    ]
    failures = [(script, start(CHECKOUT / script, installed)) for script in scripts]
    for script, failure in failures:
        if failure is not None:
            print(f"python {script}: {failure}")
    return 1 if any(failure for _, failure in failures) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
