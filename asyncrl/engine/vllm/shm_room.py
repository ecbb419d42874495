"""Room for weight-update bucket files in shared memory, checked so that a full ``/dev/shm`` is a named error.

Key decisions:
- A file in a tmpfs can be sized past the tmpfs's room (``ftruncate`` reserves nothing), and writing such a
  file through ``mmap`` then kills the process with SIGBUS: no exception, no message, and a replacement engine
  dies the same way on its catch-up. So bucket files are reserved with ``posix_fallocate`` (``reserve``), which
  answers ENOSPC on a full tmpfs, and that answer becomes ``SharedMemoryFull``.
- Before each update the directory's free room (``statvfs``) is checked against what the update will hold at
  once (``check_room``), so the refusal comes before the worker is sent anything. Other engines' files in
  flight already count against the free room then, so each engine checks only its own need; ``asyncrl
  doctor`` checks every engine of the node at once against an idle ``/dev/shm``.
- No setting moves the bucket files: a disk-backed fallback would turn a memory copy into disk writes without
  saying so. The fix named is more shared memory or smaller buckets.

Torch-free, so that ``asyncrl doctor`` can read it without importing torch.
"""

from __future__ import annotations

import errno
import os
import tempfile

SHM = "/dev/shm"
FIX = (
    "give the container more shared memory (docker run --shm-size=<size>, Kubernetes: an emptyDir with "
    "medium: Memory mounted at /dev/shm), or lower weight_sync.bucket_mb (each vLLM engine holds 2 bucket "
    "files at once)"
)
"""What makes room: no setting moves the bucket files out of ``/dev/shm`` (module docstring)."""


class SharedMemoryFull(OSError):
    """The bucket files of a weight update do not fit the shared memory they are written to (ENOSPC)."""

    def __init__(self, directory: str, needed: int, free: int, what: str) -> None:
        self.directory, self.needed, self.free, self.what = directory, needed, free, what
        message = (
            f"shared memory is full: {what} needs {size(needed)} in {directory}, which has {size(free)} free; "
            f"fix: {FIX}"
        )
        super().__init__(errno.ENOSPC, message, directory)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self) -> tuple:
        """Rebuilt from its own fields: an engine actor's error crosses Ray pickled, and ``OSError``'s own
        reduce would call this class with ``OSError``'s arguments."""
        return type(self), (self.directory, self.needed, self.free, self.what)


def shm_dir() -> str:
    """Where bucket files live: ``/dev/shm`` (memory, never disk) where the host has it, else the temp dir."""
    return SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else tempfile.gettempdir()


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged process may still write under ``directory``."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def check_room(directory: str, needed: int, what: str) -> None:
    """``SharedMemoryFull`` unless ``directory`` has ``needed`` bytes free for ``what``."""
    free = free_bytes(directory)
    if free < needed:
        raise SharedMemoryFull(directory, needed, free, what)


def reserve(fd: int, path: str, nbytes: int) -> None:
    """Give the open file ``fd`` (at ``path``) ``nbytes`` of backing memory now, so that writing it through a
    mapping cannot fault; ``SharedMemoryFull`` where its filesystem has no room. A filesystem without
    ``posix_fallocate`` support (or a platform without it) is only sized, as before."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None:  # macOS
        os.ftruncate(fd, nbytes)
        return
    try:
        allocate(fd, 0, nbytes)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            directory = os.path.dirname(path)
            raise SharedMemoryFull(directory, nbytes, free_bytes(directory), "a bucket file") from err
        if err.errno != errno.EOPNOTSUPP:
            raise
        os.ftruncate(fd, nbytes)


def size(n: int) -> str:
    """``n`` bytes for a person: MiB from one MiB up, else bytes."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"
