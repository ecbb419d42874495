"""Test-wide settings: everything loads offline, and Ray (when a test starts it) needs no auth token."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# OpenMP threads sleep as soon as their work runs out instead of spinning for it: the runs here are tiny models
# whose engine and trainer threads share 2 cores, and spinning workers took the core the other thread needed
# (a resumed sync run: 15 s of CPU spinning, 2 s without). Set before anything imports torch; children inherit.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture
def user_env() -> dict[str, str]:
    """The environment of a user's shell after the README's install: this one without ``PYTHONPATH``, so a
    documented command that starts only with the checkout on ``PYTHONPATH`` fails the test that runs it."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
