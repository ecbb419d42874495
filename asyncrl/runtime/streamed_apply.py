"""A broadcast applied as it arrives (``weight_sync.broadcast_apply: streamed``): the built-in engine loads each
bucket into its model when the bucket arrives, instead of staging the whole update until the proxy applies it.
vLLM's twin, under the same decision and failure rules, is its worker's ``op_stream`` (``engine/vllm``).

::

    stage_weights (publish)                                   update_weights(v) (proxy)
      engine paused ─► per bucket: check names/shapes ─► copy   v streamed here: nothing left to copy
      ─► every tensor came? version = v ─► pause as before      failed stream: WeightSyncError (replaced)

Key decisions:
- Only where every engine is updated at one moment (``WeightSyncConfig.broadcast_apply_for``): the weights
  change at publish, not when the proxy applies them, so the mode must have nothing trainable generating on
  the old version (``sync``) or hold every engine paused across the update (``partial_rollout``).
- The engine is paused while buckets arrive, so no step ever runs on half-new weights, and it serves the new
  version (tokens tagged with it) from the moment the last bucket lands; the proxy's ``update_weights(v)``
  then only confirms it.
- Each bucket is checked against the model (names, shapes) before any of it is copied, and the update must
  carry every tensor the model has (the manifest check of the staged path, bucket by bucket).
- A stream that fails after a bucket was copied leaves mixed weights: the engine is then *broken*. It stays
  paused, refuses ``generate``, ``resume`` and ``update_weights`` with the failure (so the proxy marks it failed
  and its recovery replaces it), until a later stream delivers a whole update (the publish's retry, sent to a
  re-formed group, does). A stream that failed before copying anything leaves the weights as they were: only
  that update fails (a broken engine stays broken and paused).
- Streams may overlap: a publish retried over a re-formed group while the old group's stream still waits.
  The engine stays paused until the last one ends, and runs again only if it ran before the first began and
  its weights are whole, so no bucket of either lands on a running engine. A superseded stream's failure is
  not reported (the later stream reports the update), but mixed weights it left mark the engine broken
  unless a later stream already applied a whole update. A break is mended only by a whole update from a
  stream begun after the one that broke it: a superseded stream landing whole after a newer one broke the
  engine leaves their buckets interleaved, so the engine stays broken (or is replaced).
- A stream whose caller gives up (the driver cancels ``stage_weights`` past its deadline) leaves its receiving
  thread running, which may still copy buckets: the engine is broken from then on, never resumed under it.
- Loading a bucket is bounded by the group's deadline (``weight_sync.timeout_s``): an engine that does not load
  it in time (its step thread wedged) is a ``WeightSyncTimeout`` and, since the copy may still land, broken.
- A failed apply (a mismatch, a deadline) does not break the collective: ``WeightGroup.receive_streamed`` drains the rest
  of the stream, so every other member still gets the whole update; a failed broadcast raises as it happens.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.flat import DeviceBucket, unpack_state
from asyncrl.weight_sync.protocol import WeightSyncError, WeightSyncTimeout
from asyncrl.weight_sync.receiver import expected_shapes


class StreamedApply:
    """One built-in engine's side of streamed broadcasts (module docstring); ``engine`` is its ``AsyncEngine``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.version: int | None = None
        """The last version a whole stream applied (what ``update_weights`` of it confirms)."""
        self.broken: WeightSyncError | None = None
        """Set while the model holds mixed weights from a stream that failed part-way."""
        self.failed: dict[int, WeightSyncError] = {}
        """Streams that failed, by version: ``update_weights`` of one raises its failure."""
        self._resume_after = False
        """Whether the engine ran before the streams now in flight (or the one that broke it) paused it."""
        self._streams = 0
        """Streams begun, numbering them; a failure of one that a later one superseded is not reported."""
        self._in_flight = 0
        """Streams begun and not ended: they overlap when a publish is retried over a re-formed group while
        the old group's stream still waits; the engine stays paused until the last one ends."""
        self._whole = 0
        """The number of the latest stream that applied a whole update."""
        self._broken_by = 0
        """The number of the latest stream that broke the engine: only a whole update from a later one mends it
        (a superseded stream landing whole after it is interleaved with its buckets)."""

    def check_serving(self, what: str) -> None:
        """``WeightSyncError`` when the engine must not serve (``broken``), naming ``what`` was refused."""
        if self.broken is not None:
            raise WeightSyncError(f"{what} refused: the engine holds a half-applied update ({self.broken})")

    async def receive(self, group: WeightGroup) -> int:
        """Receive the next broadcast and apply it bucket by bucket (the engine paused meanwhile); its version.
        A failed apply is recorded (``failed``) and the version returned, so the group's publish succeeds and
        the proxy's ``update_weights`` reports it; a failed broadcast raises."""
        if self._in_flight == 0 and self.broken is None:
            self._resume_after = not self.engine.core.paused  # what to return to once no stream is in flight
        self._in_flight += 1
        self._streams += 1
        try:
            await self.engine.pause()
            return await self._receive(group, self._streams)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self.broken is None and self._resume_after:
                await self.engine.resume()

    async def _receive(self, group: WeightGroup, mine: int) -> int:
        """``receive`` of stream number ``mine``, the engine paused."""
        loop = asyncio.get_running_loop()
        deadline_s = group.timeout.total_seconds()
        seen: set[str] = set()
        state: dict[str, Any] = {"version": None, "touched": False, "error": None}

        def apply(flat: DeviceBucket) -> None:
            try:
                state["version"] = flat.version
                if flat.version < self.engine.version:
                    raise WeightSyncError(
                        f"weight update v{flat.version} is older than the served v{self.engine.version}; refused"
                    )
                named = unpack_state(flat)
                copied = asyncio.run_coroutine_threadsafe(self.engine.apply_bucket(named), loop)
                try:
                    copied.result(deadline_s)
                except ValueError as error:
                    raise WeightSyncError(f"weight update v{flat.version}: {error}") from None
                except TimeoutError:
                    copied.cancel()
                    state["touched"] = True  # the engine may still copy it: the weights may be mixed
                    raise WeightSyncTimeout(
                        f"weight update v{flat.version}: the engine did not load a bucket within {deadline_s:g} s"
                    ) from None
                state["touched"] = True
                seen.update(named)
            except Exception as error:
                state["error"] = error
                raise

        try:
            version = await asyncio.to_thread(group.receive_streamed, apply)
        except asyncio.CancelledError:  # the receiving thread goes on, and may copy buckets yet
            self._break(mine, WeightSyncError("a streamed update was cancelled while its buckets arrived"))
            raise
        except Exception as error:
            if state["touched"] and self._whole < mine:  # mixed weights, whichever stream left them
                self._break(mine, _as_sync_error(error))
            if mine != self._streams:
                raise  # superseded: the later stream (the publish's retry) reports this update
            if error is not state["error"] or state["version"] is None:
                raise  # the broadcast itself failed: the group's publish re-forms it and sends again
            self.failed[state["version"]] = _as_sync_error(error)
            return state["version"]
        missing = sorted(expected_shapes(self.engine.core.model).keys() - seen)
        if missing:
            self.failed[version] = WeightSyncError(
                f"weight update v{version}: missing tensor(s) {missing[:5]} ({len(missing)} in all)"
            )
            self._break(mine, self.failed[version])
            return version
        await self.engine.finish_stream(version)
        self.version, self._whole = version, max(self._whole, mine)
        if mine > self._broken_by:  # else a newer stream broke the engine after this one began: still mixed
            self.broken = None
            self.failed = {v: e for v, e in self.failed.items() if v > version}
        return version

    def _break(self, mine: int, error: WeightSyncError) -> None:
        """Stream ``mine`` left mixed weights: the engine is broken until a later stream lands whole."""
        self.broken, self._broken_by = error, max(self._broken_by, mine)

    def confirm(self, version: int) -> None:
        """``update_weights(version)`` of a streamed version: its failure if its stream failed, else nothing
        (the weights landed when it arrived)."""
        if version in self.failed:
            raise self.failed.pop(version)
        self.check_serving(f"weight update v{version}")


def _as_sync_error(error: BaseException) -> WeightSyncError:
    return (
        error if isinstance(error, WeightSyncError) else WeightSyncError(f"streamed apply failed: {error!r}")
    )
