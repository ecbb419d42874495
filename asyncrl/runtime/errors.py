"""Errors of the actor runtimes, importable without Ray (the training driver catches ``TrainerDied``)."""

from __future__ import annotations


class ActorCallError(RuntimeError):
    """An actor died (or became unreachable) while a call was in flight; the message names the actor."""


class ActorCallTimeout(TimeoutError):
    """An actor did not answer a call within its timeout; the call was cancelled there."""


class TrainerDied(ActorCallError):
    """The trainer actor died or stopped answering: its weights and optimizer state are gone, so the run can
    only go on from its last verified checkpoint (``app.train`` restarts it from there)."""
