"""Calls into Ray actors that never wait forever: every result is awaited with a timeout, and a dead actor fails
the call at once with an error naming it (the runtime's actors are never restarted behind a caller's back)."""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from asyncrl.runtime.errors import ActorCallError, ActorCallTimeout, TrainerDied


async def await_actor(ref: ray.ObjectRef, what: str, timeout_s: float) -> Any:
    """The result of ``ref`` within ``timeout_s``; the task is cancelled on timeout or when the caller cancels."""
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
    except TimeoutError:
        ray.cancel(ref)
        raise ActorCallTimeout(f"{what}: no answer within {timeout_s} s (cancelled)") from None
    except asyncio.CancelledError:
        ray.cancel(ref)
        raise
    except RayActorError as error:
        raise ActorCallError(f"{what}: the actor died or is unreachable") from error


def get_actor(ref: ray.ObjectRef | list[ray.ObjectRef], what: str, timeout_s: float) -> Any:
    """Blocking form of ``await_actor`` for callers outside an event loop (the trainer runs in a thread)."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        for pending in ref if isinstance(ref, list) else [ref]:
            ray.cancel(pending)
        raise ActorCallTimeout(f"{what}: no answer within {timeout_s} s (cancelled)") from None
    except RayActorError as error:
        raise ActorCallError(f"{what}: the actor died or is unreachable") from error


def get_trainer(ref: ray.ObjectRef | list[ray.ObjectRef], what: str, timeout_s: float) -> Any:
    """``get_actor`` for the trainer: a dead or silent trainer is ``TrainerDied``, which the run recovers from
    (``app.train`` restarts it from its last verified checkpoint)."""
    try:
        return get_actor(ref, what, timeout_s)
    except (ActorCallError, ActorCallTimeout) as error:
        raise TrainerDied(f"{what}: the trainer is lost ({error})") from error
