"""The progress display draws a bar on a terminal and falls back to plain lines under a pipe."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import termios

from asyncrl.metrics.progress import Progress


def drive(stream, mode="auto") -> None:
    progress = Progress(3, label="step", stream=stream, mode=mode)
    for done in (1, 2, 3):
        progress.update(done, {"reward": 0.5 * done})
    progress.close()


def read_all(fd: int) -> str:
    """Everything written to the terminal so far (a pty hands it out in chunks)."""
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        chunks.append(os.read(fd, 65536))
    return b"".join(chunks).decode()


def test_under_a_pipe_every_update_is_one_plain_line_with_an_eta_until_the_end():
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as stream:
        assert not stream.isatty()
        drive(stream)
    with os.fdopen(read_fd) as pipe:
        lines = pipe.read().splitlines()
    assert len(lines) == 3 and "\r" not in "".join(lines)
    assert lines[0].startswith("[step 1/3] reward=0.5  eta=")
    assert lines[2] == "[step 3/3] reward=1.5"


def terminal() -> tuple[int, int]:
    """A pseudo-terminal 100 columns wide (a fresh pty reports 0 columns, where a bar has no room)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    return master, slave


def test_on_a_terminal_a_bar_redraws_in_place():
    master, slave = terminal()
    with os.fdopen(slave, "w") as stream:
        assert stream.isatty()
        drive(stream)
        output = read_all(master)
    os.close(master)
    assert "\r" in output and "3/3" in output and "reward=1.5" in output


def test_lines_can_be_forced_on_a_terminal():
    master, slave = terminal()
    with os.fdopen(slave, "w") as stream:
        drive(stream, mode="lines")
        output = read_all(master)
    os.close(master)
    assert "[step 3/3] reward=1.5" in output
