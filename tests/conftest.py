"""Test-wide settings: everything loads offline, and Ray (when a test starts it) needs no auth token."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture
def user_env() -> dict[str, str]:
    """The environment of a user's shell after the README's install: this one without ``PYTHONPATH``, so a
    documented command that starts only with the checkout on ``PYTHONPATH`` fails the test that runs it."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
