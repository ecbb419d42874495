"""A replaced engine's catch-up under ``runtime.switch``: the trainer lets go of its packed copy once every
engine applied it (``colocate.ColocatedTrainer.weights_applied``), so an engine replaced after that (the
proxy's recovery, ``proxy.recovery``) is sent a copy of the same version packed again on demand, for that
engine only (on Ray: by the trainer rank in its bundle, ``pack_for``), let go once it applied it.

Key decision: pack again rather than keep the copy resident. From a publication until the next training step
the trainer's weights are the published version's (sync trains only after generation; offload and reload move
them bit for bit), so packing them again gives the same bytes; once the next step began they are not, and the
replacement waits for the next publication instead (``proxy.recovery.Superseded``).

::

    lend(update, engine):  held ──────────────────────────────────────► sent as is (its release waits for it)
                           released, trainer idle at update.version ──► packed again for ``engine`` (shared by
                                                                        catch-ups of that engine; another
                                                                        engine's waits until it is let go)
                           released, trainer training or moved on ────► Superseded: wait for the next update
    give_back():           the last reader done ──► the fresh copy let go (``held_bytes`` 0 again)

Invariants (tests/unit/runtime/test_republish.py): a training step and a release wait until no catch-up reads
a copy, so a copy is never let go while an engine reads it and is never packed from weights mid-step; at most
one packed copy exists (a fresh one only while the published one is released), packed for one engine; a fresh
copy's version is the stored update's; every lend is given back, a cancelled catch-up's too.

Deadlines (``CatchUpDeadlines``): a step or a release waits for catch-ups still reading at most as long as a
catch-up may read (the proxy's update deadline for the copy's bytes) plus ``runtime.control_timeout_s``
(``StillReading``); a replacement waits for the next publication at most a training step, a publication and
the switch's engine calls (``CatchUpTimeout``, raised by the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.config.run import RunConfig
from asyncrl.proxy.recovery import Superseded
from asyncrl.weight_sync.colocated import is_released, mark_released
from asyncrl.weight_sync.protocol import WeightSyncError

logger = logging.getLogger(__name__)


class StillReading(TimeoutError):
    """A training step or a release waited past its deadline for a replaced engine still reading a copy."""


@dataclass(frozen=True)
class CatchUpDeadlines:
    """How long the catch-up's waits may last (module docstring)."""

    control_s: float
    """``runtime.control_timeout_s``: the margin of a wait for readers, and of one for the next publication."""
    publish_s: float
    """From a step's start until its weights are published: ``runtime.train_step_timeout_s`` plus
    ``weight_sync.timeout_s`` (the switch's engine calls are in ``control_s``)."""
    read_s: Callable[[int], float]
    """How long a catch-up may read a copy of so many bytes (``proxy.update_timeout_s``, its update's deadline)."""

    @classmethod
    def of(cls, config: RunConfig) -> CatchUpDeadlines:
        runtime = config.runtime
        return cls(
            control_s=runtime.control_timeout_s,
            publish_s=runtime.train_step_timeout_s + config.weight_sync.timeout_s,
            read_s=config.proxy.update_timeout_s,
        )

    @classmethod
    def within(cls, timeout_s: float) -> CatchUpDeadlines:
        """Every wait bounded by ``timeout_s`` (a switch built by hand, without a run's config)."""
        return cls(control_s=timeout_s, publish_s=timeout_s, read_s=lambda nbytes: timeout_s)


class Republisher:
    """Lends a replaced engine the update it catches up to (contract: module docstring). ``inner`` is the
    trainer facade (``pack_for(engine)`` packs for one engine, ``release_published`` lets go, ``version``)."""

    def __init__(self, inner: Any, deadlines: CatchUpDeadlines) -> None:
        self.inner = inner
        self.deadlines = deadlines
        self._lock = threading.Condition()
        self._num_readers = 0
        self._read_s = 0.0
        """The longest a current reader may still read (its copy's ``read_s``); 0 when none reads."""
        self._fresh: Any = None
        """The copy packed again for catch-ups (None when none is out) ..."""
        self._fresh_for = -1
        """... and the engine it was packed for."""
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
    async def for_catch_up(self, payload: Any, engine: int) -> AsyncIterator[Any]:
        """``payload`` (the proxy's latest update) as replaced engine ``engine`` can read it, for the ``async
        with`` body that applies it (``proxy.recovery.EngineRecovery``'s ``readable``). Cancelled while
        lending or giving back, the lend is still given back: a reader left counted would stall every step."""
        lending = asyncio.ensure_future(asyncio.to_thread(self.lend, payload, engine))
        try:
            lent = await asyncio.shield(lending)
        except asyncio.CancelledError:  # the lend still completes: give it back when it does
            lending.add_done_callback(self._give_back_if_lent)
            raise
        try:
            yield lent
        finally:
            await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(self.give_back)))

    def lend(self, update: Any, engine: int) -> Any:
        """``update`` while the trainer holds its blocks, else a fresh copy of its version packed for
        ``engine`` (module docstring); each lend is matched by one ``give_back``."""
        with self._lock:
            if not is_released(update):
                return self._lent(update)
            if not self._lock.wait_for(
                lambda: self._fresh is None or self._fresh_for == engine, self._reading_s()
            ):
                raise StillReading(
                    f"engine {engine}: its catch-up to v{update.version} waited {self._reading_s()} s for "
                    f"engine {self._fresh_for} to finish reading the copy packed again for it"
                )
            if self._fresh is None:
                self._fresh = self._pack_again(update, engine)
                self._fresh_for = engine
            return self._lent(self._fresh)

    def give_back(self) -> None:
        """A catch-up is done with what it was lent; the last one lets the fresh copy go."""
        with self._lock:
            self._num_readers -= 1
            if self._num_readers == 0:
                self._read_s = 0.0
                if self._fresh is not None:
                    mark_released(self._fresh)
                    nbytes = self.inner.release_published()
                    logger.info(
                        "the copy of v%d packed again for replaced engine %d let go (%d B)",
                        self._fresh.version,
                        self._fresh_for,
                        nbytes,
                    )
                    self._fresh, self._fresh_for = None, -1
            self._lock.notify_all()

    def _lent(self, update: Any) -> Any:
        self._num_readers += 1
        self._read_s = max(self._read_s, self.deadlines.read_s(int(update.nbytes)))
        return update

    def _give_back_if_lent(self, lending: asyncio.Future[Any]) -> None:
        """Off the event loop: ``give_back`` may wait for the lock and let a copy go."""
        if not lending.cancelled() and lending.exception() is None:
            asyncio.get_running_loop().run_in_executor(None, self.give_back)

    def _pack_again(self, update: Any, engine: int) -> Any:
        """A fresh copy of ``update``'s version for ``engine`` from the trainer's weights, or ``Superseded``
        once they are no longer that version (the replacement catches up to the next one)."""
        version = self.inner.version
        if self._training or version != update.version:
            now = f"v{version}, training its next step" if self._training else f"v{version}"
            raise Superseded(
                f"weight update v{update.version}: the trainer let go of its colocated copy once every engine "
                f"had applied it (runtime.switch) and its weights are now {now}, so a replaced engine is sent "
                "the next update instead",
                within_s=self.deadlines.publish_s + self.deadlines.control_s,
            )
        fresh = self.inner.pack_for(engine)
        if fresh.version != update.version:
            mark_released(fresh)
            self.inner.release_published()
            raise WeightSyncError(
                f"weight update v{update.version}: packed again as v{fresh.version}; a replaced engine is sent "
                "only the version the proxy published"
            )
        logger.warning("v%d packed again for replaced engine %d (runtime.switch)", fresh.version, engine)
        return fresh

    def _reading_s(self) -> float:
        """How long to wait for the current readers: their longest read, plus ``control_s``."""
        return self._read_s + self.deadlines.control_s

    def _wait_idle(self, what: str) -> None:
        """With the lock held: until no catch-up reads a copy, within ``_reading_s``."""
        within_s = self._reading_s()
        if not self._lock.wait_for(lambda: self._num_readers == 0, within_s):
            raise StillReading(
                f"{what} (runtime.switch) waited {within_s} s (the catch-up's update deadline plus "
                "runtime.control_timeout_s) for a replaced engine to finish reading the trainer's packed copy"
            )
