"""The broadcast weight group as the driver keeps it: formed, re-formed when its members change, and every
wait bounded, so the broadcast transport survives an engine replacement.

::

    publish (controller's thread)                     engine replaced (proxy recovery, event loop)
      lock ─► members changed or last send failed?      factory: new actor ─► replaced(index, client)
              └► form: probe engines, new rendezvous,   recovery catch-up: update_weights(latest broadcast)
                 every live engine + rank 0 join           └► not staged there: ``catch_up`` places trainer
      ─► engines start receiving, rank 0 sends             rank 0's last broadcast in the object store
      ─► a member failed: form again without it, send      (its packed copy, kept for this) and the engine
         once more; the trainer failed: ``TrainerDied``     reads it like an object-store update

Key decisions:
- A process group cannot take in a new member, so every membership change forms a new group (a new port, the
  same deadline ``weight_sync.timeout_s``); old groups are dropped by every member.
- Before forming, every engine is probed; one that does not answer, or answers but does not join in time, is
  left out (``WeightGroupError`` only when rank 0 itself cannot form it). A left-out engine cannot stage the
  next broadcast; its update then fails, and the proxy's recovery replaces it.
- A replacement catches up from trainer rank 0's last broadcast, kept packed in host memory while engine
  recovery is on (one model's bytes), not from the trainer's live weights: the trainer is usually mid-step,
  its weights already past the version the proxy serves.
- Every call is bounded: probes by ``control_timeout_s``, joins, sends and receives by ``weight_sync.timeout_s``.
- With one trainer rank a failed send is a member's (formed again without it); with several it is the
  trainer's: the other ranks wait in the next bucket's gather for a rank 0 that left, so the send fails at
  once as ``TrainerDied`` (``runtime.rank_calls``) and the run restarts from its checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayError

from asyncrl.runtime.actor_calls import get_actor, get_trainer
from asyncrl.runtime.errors import ActorCallError, ActorCallTimeout, TrainerDied
from asyncrl.runtime.rank_calls import call_ranks
from asyncrl.weight_sync.protocol import WeightSyncError, WeightUpdate

logger = logging.getLogger(__name__)

WEIGHTS_GROUP = "weights"
"""Trainer rank actors' concurrency group for catch-up copies, so one runs while a train step does."""


class WeightGroupError(WeightSyncError):
    """The broadcast group could not be formed or could not deliver an update within its deadline."""


class BroadcastGroup:
    """Trainer rank 0 (``trainer_handles[0]``) and the engines (``engines``: clients with a ``handle`` to an
    ``EngineActor``) as one broadcast group (module docstring). ``publish`` is called from one thread at a
    time (the controller's); ``replaced`` and ``catch_up`` from anywhere."""

    def __init__(
        self,
        trainer_handles: list[Any],
        engines: list[Any],
        *,
        timeout_s: float,
        probe_timeout_s: float,
        retain: bool,
    ) -> None:
        self.trainer_handles = trainer_handles
        self.engines = list(engines)
        self.timeout_s = timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.retain = retain
        """Whether rank 0 keeps its last broadcast packed for catch-ups (engine recovery is on)."""
        self.members: list[Any] = []
        self.num_formed = 0
        self.before_send: Callable[[], None] | None = None
        """Test seam: runs after the engines started receiving and before rank 0 sends."""
        self._lock = threading.Lock()
        self._formed_with: list[Any] | None = None

    def replaced(self, index: int, client: Any) -> None:
        """Engine ``index`` is now ``client``: the next publish forms the group anew with it."""
        self.engines[index] = client

    def form(self) -> None:
        """A new group of rank 0 and every engine that answers and joins within the deadlines: engines that
        answer but do not join are left out and the group formed once more without them."""
        candidates = [engine for engine in self.engines if self._answers(engine)]
        for _ in range(2):
            joined = self._form_with(candidates)
            if joined is None:
                self.members = candidates
                self._formed_with = list(self.engines)
                self.num_formed += 1
                logger.info("weight group formed (%d): %s", self.num_formed, [e.name for e in candidates])
                return
            left_out = [e.name for e in candidates if e not in joined]
            logger.warning("engines %s did not join the weight group within %s s", left_out, self.timeout_s)
            candidates = joined
        raise WeightGroupError(f"weight group: not formed within {self.timeout_s} s, twice")

    def _form_with(self, engines: list[Any]) -> list[Any] | None:
        """Form the group of rank 0 and ``engines``; None once formed, else the engines that did join."""
        rank0 = self.trainer_handles[0]
        what = "trainer rank 0: weight group"
        host, port = get_trainer(rank0.open_weight_group.remote(), what, self.timeout_s)
        world_size = len(engines) + 1
        trainer_ref = rank0.join_weight_group.remote(host, port, world_size, self.timeout_s)
        joins = {
            engine.handle.join_weight_group.remote(host, port, rank + 1, world_size, self.timeout_s): engine
            for rank, engine in enumerate(engines)
        }
        refs = [trainer_ref, *joins]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s + 5)
        if not pending:
            get_trainer(trainer_ref, "trainer rank 0: join weight group", self.timeout_s)
            get_actor(list(joins), "engines: join weight group", self.timeout_s)
            return None
        for ref in pending:
            ray.cancel(ref)
        return [joins[ref] for ref in ready if ref in joins]

    def publish(self, bucket_bytes: int) -> WeightUpdate:
        """Broadcast the trainer's weights to every member (staged there, or applied as it arrives with
        ``weight_sync.broadcast_apply`` streamed); forms the group first when its
        members changed; a failed send forms it again without the failed member and sends once more."""
        with self._lock:
            for attempt in (1, 2):
                if self._formed_with != self.engines:
                    self.form()
                try:
                    return self._send(bucket_bytes)
                except TrainerDied:
                    raise
                except (ActorCallError, ActorCallTimeout, RayError, WeightSyncError) as error:
                    logger.warning("weight broadcast failed (attempt %d): %s", attempt, error)
                    self._formed_with = None
                    last_error = error
            raise WeightGroupError(f"weight broadcast failed twice: {last_error}") from last_error

    def catch_up(self, update: WeightUpdate) -> WeightUpdate:
        """Rank 0's last broadcast, placed in the object store: an object-store update of ``update.version``
        for an engine that did not stage it (a replacement). ``WeightSyncError`` when rank 0 holds another."""
        ref = (
            self.trainer_handles[0]
            .place_last_broadcast.options(concurrency_group=WEIGHTS_GROUP)
            .remote(update.version)
        )
        return get_trainer(ref, f"trainer rank 0: catch-up copy of v{update.version}", self.timeout_s)

    def _send(self, bucket_bytes: int) -> WeightUpdate:
        staging = [engine.handle.stage_weights.remote() for engine in self.members]
        if self.before_send is not None:
            self.before_send()
        refs = [
            handle.publish_weights.remote(bucket_bytes, "broadcast", self.retain)
            for handle in self.trainer_handles
        ]
        if len(refs) > 1:  # rank 0 failing mid-send leaves the others in a gather: the trainer is lost
            update = call_ranks(self.trainer_handles, refs, "trainer: broadcast weights", self.timeout_s)[0]
            get_actor(staging, "engines: stage broadcast weights", self.timeout_s)
            return update
        try:
            update = get_actor(refs, "trainer: broadcast weights", self.timeout_s)[0]
        except ActorCallError:
            self._raise_if_trainer_dead()
            raise
        get_actor(staging, "engines: stage broadcast weights", self.timeout_s)
        return update

    def _raise_if_trainer_dead(self) -> None:
        """``TrainerDied`` if a trainer rank is gone (a failed send is then the trainer's, not a member's)."""
        refs = [handle.progress.remote() for handle in self.trainer_handles]
        get_trainer(refs, "trainer: alive", self.probe_timeout_s)

    def _answers(self, engine: Any) -> bool:
        try:
            get_actor(engine.handle.ready.remote(), f"engine {engine.name}: probe", self.probe_timeout_s)
        except (ActorCallError, ActorCallTimeout) as error:
            logger.warning("engine %s left out of the weight group: %s", engine.name, error)
            return False
        return True
