"""Test-wide settings: everything loads offline, and Ray (when a test starts it) needs no auth token."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
