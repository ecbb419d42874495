"""The progress display draws a bar on a terminal and falls back to plain lines under a pipe; the libraries'
own bars (Hugging Face's) follow the same rule."""

from __future__ import annotations

import fcntl
import importlib
import os
import pty
import select
import struct
import termios

import huggingface_hub.utils
import pytest
import transformers.utils.logging

from asyncrl.metrics.progress import LIBRARY_BARS, Progress, library_bars_follow_terminal

DATASETS_BARS = importlib.import_module("datasets.utils.tqdm")  # the package's ``tqdm`` attribute is a class


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


@pytest.fixture
def library_bars(monkeypatch):
    """Hugging Face's bars on, no switch in the environment; put back as they were after the test."""
    for switch, _, _ in LIBRARY_BARS:
        monkeypatch.delenv(switch, raising=False)
    before = (
        huggingface_hub.utils.are_progress_bars_disabled(),
        transformers.utils.logging.is_progress_bar_enabled(),
        DATASETS_BARS.are_progress_bars_disabled(),
    )
    huggingface_hub.utils.enable_progress_bars()
    transformers.utils.logging.enable_progress_bar()
    DATASETS_BARS.enable_progress_bars()
    yield
    hub_off, transformers_on, datasets_off = before
    (huggingface_hub.utils.disable_progress_bars if hub_off else huggingface_hub.utils.enable_progress_bars)()
    logging = transformers.utils.logging
    (logging.enable_progress_bar if transformers_on else logging.disable_progress_bar)()
    (DATASETS_BARS.disable_progress_bars if datasets_off else DATASETS_BARS.enable_progress_bars)()


def library_bars_on() -> list[bool]:
    return [
        not huggingface_hub.utils.are_progress_bars_disabled(),
        transformers.utils.logging.is_progress_bar_enabled(),
        not DATASETS_BARS.are_progress_bars_disabled(),
    ]


def test_library_bars_are_switched_off_under_a_pipe_here_and_in_later_processes(library_bars):
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as stream:
        library_bars_follow_terminal(stream)
    os.close(read_fd)
    assert library_bars_on() == [False, False, False]
    assert (
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
    )


def test_library_bars_stay_on_a_terminal_and_a_switch_the_user_set_is_kept(library_bars, monkeypatch):
    master, slave = terminal()
    with os.fdopen(slave, "w") as stream:
        library_bars_follow_terminal(stream)
    os.close(master)
    assert library_bars_on() == [True, True, True]
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as stream:
        library_bars_follow_terminal(stream)
    os.close(read_fd)
    assert library_bars_on() == [True, True, False]
