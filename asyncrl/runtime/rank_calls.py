"""One call on every trainer rank, awaited so that the first rank to fail fails the call at once.

The ranks of a group meet in collectives, so a rank that raises mid-step leaves the others blocked in their next
one until the process group's timeout (``trainer_group.collective_timeout_s``: 693 s for the 8B recipe), or the
NCCL watchdog kills them. ``ray.get`` over every rank (Ray 2.60) raises the first rank error as it lands, but as
the rank's own exception: not ``TrainerDied``, so the run ended instead of restarting, with no rank named, and
the blocked ranks were left in their collective. Here each rank's answer is taken as it lands (``ray.wait``,
within what is left of the call's deadline), and the first failure decides:

- a rank's error that the ranks raise together by contract (``agreed``: a load's ``TornCheckpointError``, which
  every rank raises after the same gathers): the others are waited for, the group stays usable, and the error
  is raised as the rank raised it (``checkpoint.load_resume`` then tries the previous checkpoint);
- a fault of the run itself (``RUN_FAULTS``: bad configuration or input, a bug; it would recur after a restart):
  the ranks still busy are killed and the rank's error is raised as is (as a Ray task error that is also an
  instance of it), so the run ends with its cause instead of restarting into it;
- anything else (a CUDA out-of-memory, a CUDA or NCCL error, an I/O error), a rank actor that died, or the
  deadline passed: the ranks still busy are killed (they are in, or on their way into, a collective the failed
  rank will never join) and the call raises ``TrainerDied`` naming the rank and its error, so ``app.train``
  restarts the run from its last verified checkpoint (``runtime.trainer_restarts`` bounds how often).

The failed rank and the ranks that had answered are idle and are left alive: the group's ``shutdown`` (the
restart's teardown) ends them after they let go of what they published (shared-memory blocks a killed process
would leave behind).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import monotonic
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from asyncrl.runtime.errors import TrainerDied
from asyncrl.trainer.optim import NonFiniteGradientError

logger = logging.getLogger(__name__)

RUN_FAULTS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    NotImplementedError,
    AssertionError,
    NonFiniteGradientError,
)
"""A rank's errors that are the run's fault (configuration, input, a bug, a run diverging past
``trainer.max_consecutive_skipped_updates``): raised as they are, never retried.
Every other error of a rank is taken as the trainer lost (``TrainerDied``). A deterministic ``RuntimeError``
(a shape mismatch) is retried too, at most ``runtime.trainer_restarts`` times, then fails with its text."""


def call_ranks(
    handles: Sequence[Any],
    refs: Sequence[ray.ObjectRef],
    what: str,
    timeout_s: float,
    *,
    agreed: tuple[type[BaseException], ...] = (),
) -> list[Any]:
    """Every rank's answer to ``refs`` (``refs[i]`` a call on ``handles[i]``), in rank order, within
    ``timeout_s`` in all; the first failure fails the call as the module docstring says."""
    deadline = monotonic() + timeout_s
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    answers: dict[int, Any] = {}
    agreed_error: RayTaskError | None = None
    pending = list(refs)
    while pending:
        left_s = max(0.0, deadline - monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left_s)
        if not ready:
            silent = sorted(rank_of[ref] for ref in pending)
            _stop(handles, silent, what)
            raise TrainerDied(f"{what}: the trainer is lost (ranks {silent}: no answer within {timeout_s} s)")
        for ref in ready:
            rank = rank_of[ref]
            try:
                answers[rank] = ray.get(ref, timeout=0)  # ready: at once
            except RayActorError as error:
                _stop(handles, [rank_of[r] for r in pending], what)
                raise TrainerDied(f"{what}: the trainer is lost (rank {rank}: the actor died)") from error
            except RayTaskError as error:
                cause = error.cause
                if isinstance(cause, agreed):
                    agreed_error = agreed_error or error
                    continue
                _stop(handles, [rank_of[r] for r in pending], what)
                if isinstance(cause, RUN_FAULTS):
                    logger.error("%s: trainer rank %d failed: %s", what, rank, describe(cause))
                    raise
                raise TrainerDied(f"{what}: the trainer is lost (rank {rank}: {describe(cause)})") from error
            except RayError as error:  # its answer lost with its node, say: the group cannot go on either
                _stop(handles, [rank_of[r] for r in pending], what)
                raise TrainerDied(f"{what}: the trainer is lost (rank {rank}: {describe(error)})") from error
    if agreed_error is not None:
        raise agreed_error
    return [answers[rank] for rank in range(len(refs))]


def describe(error: BaseException) -> str:
    """``torch.OutOfMemoryError: CUDA out of memory...``: the error's type, qualified unless a builtin, and text."""
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name}: {error}"


def _stop(handles: Sequence[Any], ranks: list[int], what: str) -> None:
    """Kill the ranks still running the failed call: blocked in a collective, they would wait out the group's
    timeout, and the group cannot go on without the failed rank anyway."""
    if ranks:
        logger.warning("%s: killing trainer ranks %s, still running the failed call", what, sorted(ranks))
    for rank in ranks:
        ray.kill(handles[rank], no_restart=True)
