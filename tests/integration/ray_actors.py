"""Waiting for a Ray actor to be gone: ``ray.kill`` returns before the actor is, and a call sent right after it
can still be answered on a loaded machine (CI once saw exactly that)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray


def until_dead(call: Callable[[], Any], deadline_s: float = 60.0) -> ray.exceptions.RayError:
    """Send ``call`` (an actor method's ``.remote()``) until its answer is a Ray error, which is returned;
    ``AssertionError`` naming the deadline if the actor still answers after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the actor still answers {deadline_s} s after it was killed"
        try:
            ray.get(call(), timeout=left)
        except ray.exceptions.GetTimeoutError:
            continue  # the loop's assertion names the deadline
        except ray.exceptions.RayError as error:
            return error
        time.sleep(0.05)
