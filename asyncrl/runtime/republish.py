"""A replaced engine's catch-up under ``runtime.switch``: the trainer lets go of its packed copy once every
engine applied it (``colocate.ColocatedTrainer.weights_applied``), so an engine replaced after that (the
proxy's recovery, ``proxy.recovery``) is sent a copy of the same version packed again on demand, let go once
it applied it.

Key decision: pack again rather than keep the copy resident. From a publication until the next training step
the trainer's weights are the published version's (sync trains only after generation; offload and reload move
them bit for bit), so packing them again gives the same bytes; once the next step began they are not, and the
catch-up is refused by name.

::

    lend(update):  held ──────────────────────────────────────► sent as is (its release waits for the engine)
                   released, trainer idle at update.version ──► packed again (shared by concurrent catch-ups)
                   released, trainer training or moved on ────► WeightSyncError naming both versions
    give_back():   the last reader done ──► the fresh copy let go (``held_bytes`` 0 again)

Invariants (tests/unit/runtime/test_republish.py): a training step and a release wait until no catch-up reads
a copy, so a copy is never let go while an engine reads it and is never packed from weights mid-step; at most
one packed copy exists (a fresh one only while the published one is released); a fresh copy's version is the
stored update's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from asyncrl.weight_sync.colocated import is_released, mark_released
from asyncrl.weight_sync.protocol import WeightSyncError

logger = logging.getLogger(__name__)


class Republisher:
    """Lends a replaced engine the update it catches up to (contract: module docstring). ``inner`` is the
    trainer facade (``state_for_sync`` packs, ``release_published`` lets go, ``version``); ``timeout_s`` bounds
    how long a step or a release waits for catch-ups still reading (``runtime.control_timeout_s``)."""

    def __init__(self, inner: Any, timeout_s: float) -> None:
        self.inner = inner
        self.timeout_s = timeout_s
        self._lock = threading.Condition()
        self._num_readers = 0
        self._fresh: Any = None
        """The copy packed again for catch-ups (None when none is out)."""
        self._training = False
        """From a step's start until its publication: the trainer's weights are no published version's."""

    def begin_step(self) -> None:
        """A training step starts: wait until no catch-up reads a copy, then refuse new ones until ``published``."""
        with self._lock:
            self._wait_idle("a training step")
            self._training = True

    def published(self) -> None:
        """The step's weights are published: a catch-up may pack them again (once they are released)."""
        with self._lock:
            self._training = False

    def release(self, update: Any) -> int:
        """Every engine holds ``update``: mark it released and let the trainer go of its copy, once no catch-up
        reads it; the bytes let go."""
        with self._lock:
            self._wait_idle(f"the release of v{update.version}")
            mark_released(update)
            return int(self.inner.release_published())

    @contextlib.asynccontextmanager
    async def for_catch_up(self, payload: Any) -> AsyncIterator[Any]:
        """``payload`` (the proxy's latest update) as a replaced engine can read it, for the ``async with``
        body that applies it (``proxy.recovery.EngineRecovery``'s ``readable``)."""
        lending = asyncio.ensure_future(asyncio.to_thread(self.lend, payload))
        try:
            lent = await asyncio.shield(lending)
        except asyncio.CancelledError:  # the lend still completes: give it back when it does
            lending.add_done_callback(self._give_back_if_lent)
            raise
        try:
            yield lent
        finally:
            await asyncio.to_thread(self.give_back)

    def lend(self, update: Any) -> Any:
        """``update`` while the trainer holds its blocks, else a fresh copy of its version (module docstring);
        each lend is matched by one ``give_back``."""
        with self._lock:
            if not is_released(update):
                self._num_readers += 1
                return update
            if self._fresh is None:
                self._fresh = self._pack_again(update)
            self._num_readers += 1
            return self._fresh

    def give_back(self) -> None:
        """A catch-up is done with what it was lent; the last one lets the fresh copy go."""
        with self._lock:
            self._num_readers -= 1
            if self._num_readers == 0 and self._fresh is not None:
                mark_released(self._fresh)
                nbytes = self.inner.release_published()
                logger.info(
                    "the copy of v%d packed again for a replaced engine let go (%d B)",
                    self._fresh.version,
                    nbytes,
                )
                self._fresh = None
            self._lock.notify_all()

    def _give_back_if_lent(self, lending: asyncio.Future[Any]) -> None:
        if not lending.cancelled() and lending.exception() is None:
            self.give_back()

    def _pack_again(self, update: Any) -> Any:
        """A fresh copy of ``update``'s version from the trainer's weights, refused by name if they are not it."""
        version = self.inner.version
        if self._training or version != update.version:
            now = f"v{version}, training its next step" if self._training else f"v{version}"
            raise WeightSyncError(
                f"weight update v{update.version}: the trainer let go of its colocated copy once every engine "
                f"had applied it (runtime.switch) and its weights are now {now}, so a replaced engine cannot "
                f"be sent v{update.version} again"
            )
        fresh = self.inner.state_for_sync()
        if fresh.version != update.version:
            mark_released(fresh)
            self.inner.release_published()
            raise WeightSyncError(
                f"weight update v{update.version}: packed again as v{fresh.version}; a replaced engine is sent "
                "only the version the proxy published"
            )
        logger.warning("v%d packed again for a replaced engine (runtime.switch)", fresh.version)
        return fresh

    def _wait_idle(self, what: str) -> None:
        """With the lock held: until no catch-up reads a copy, within ``timeout_s``."""
        if not self._lock.wait_for(lambda: self._num_readers == 0, self.timeout_s):
            raise TimeoutError(
                f"{what} (runtime.switch) waited runtime.control_timeout_s={self.timeout_s} s for a replaced "
                "engine to finish reading the trainer's packed copy"
            )
