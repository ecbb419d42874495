"""Runs first inside the sandbox (trusted): drop to the slot's uid, set the rlimits, exec the program.

Usage (inside bwrap): ``python -I -S launcher.py UID REPORT_FD LIMITS_JSON PROGRAM [ARGS...]``; the
report pipe arrives at whatever number the host had free and is moved to fd 3. Run as root (the host
ran bwrap as root without a user namespace) it gives up root for ``UID``, which also drops the two
capabilities bwrap kept for it; in a user namespace it already is ``UID``. Limits are set after the uid
change, so ``RLIMIT_NPROC`` counts this uid's processes. Imports only builtins: it runs before any limit.
"""

import json
import os
import resource
import sys


def main() -> None:
    uid, report_fd, limits, program = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        json.loads(sys.argv[3]),
        sys.argv[4:],
    )
    if report_fd != 3:
        os.dup2(report_fd, 3)
    if report_fd > 3:
        os.close(report_fd)
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        sys.exit("sandbox launcher: still root after dropping privileges")
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.execv(sys.executable, [sys.executable, "-I", "-B", *program])


if __name__ == "__main__":
    main()
