"""The one admission policy of an engine: what may start running, what it reserves, how prefill is chunked.

Used by the real ``Scheduler`` and by the simulator's ``SimEngine``, so a simulated engine admits exactly the
requests a real one would (a test feeds both the same trace).

Rules:
- A request reserves its worst-case KV up front: ``min(prompt + max_new_tokens, max_model_len)`` tokens, so a
  running request never runs out of KV and is never preempted. A request whose reservation exceeds
  ``max_kv_tokens`` can never run: an error naming it.
- Waiting requests are admitted strictly first come, first served while a slot is free
  (``max_running_requests``) and the head's reservation fits what is left; the first that does not fit stops
  admission, so a large request at the head is not starved by small ones behind it.
- Prefill is chunked: requests still prefilling share ``max_prefill_tokens_per_step`` tokens in admission order
  (None: no limit, every pending context in one step).

The length cap is where the two engines used to disagree: the real engine capped the reservation at
``max_model_len``, the simulator reserved ``prompt + max_new_tokens`` uncapped. The cap won (a request never
grows past the context, so reserving beyond it only wastes KV); the simulator now takes ``engine.max_model_len``
and ends a request there too (None: an unbounded context, its previous behaviour).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AdmissionPolicy:
    """Slot, KV and prefill limits of one engine replica (see the module docstring)."""

    max_running_requests: int
    """Most requests running at once (slots)."""
    max_kv_tokens: int
    """KV budget in tokens shared by the running requests' reservations."""
    max_prefill_tokens_per_step: int | None = None
    """Prefill tokens fed per engine step across requests (None: unlimited)."""
    max_model_len: int | None = None
    """Longest context a request may reach (prompt + output); None: unbounded."""

    def reservation(self, num_prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens a request holds while it runs: its longest possible length."""
        longest = num_prompt_tokens + max_new_tokens
        return longest if self.max_model_len is None else min(longest, self.max_model_len)

    def check_fits(self, request_id: str, reservation: int) -> None:
        """``ValueError`` naming the request when its reservation can never fit the KV budget."""
        if reservation > self.max_kv_tokens:
            raise ValueError(
                f"request {request_id}: needs {reservation} KV tokens, more than "
                f"engine.max_kv_tokens={self.max_kv_tokens}"
            )

    def admits(self, *, num_running: int, kv_reserved: int, reservation: int) -> bool:
        """Whether a request reserving ``reservation`` may start now."""
        return num_running < self.max_running_requests and kv_reserved + reservation <= self.max_kv_tokens

    def num_admitted(self, waiting_reservations: Iterable[int], *, num_running: int, kv_reserved: int) -> int:
        """How many requests from the head of the FIFO queue start now (stops at the first that cannot)."""
        count = 0
        for reservation in waiting_reservations:
            if not self.admits(
                num_running=num_running + count, kv_reserved=kv_reserved, reservation=reservation
            ):
                break
            kv_reserved += reservation
            count += 1
        return count

    def prefill_chunks(self, pending_tokens: Iterable[int]) -> list[int]:
        """Tokens each prefilling request feeds this step, in admission order, within the step's budget."""
        budget = self.max_prefill_tokens_per_step
        chunks = []
        for pending in pending_tokens:
            num_tokens = pending if budget is None else min(pending, budget)
            if budget is not None:
                budget -= num_tokens
            chunks.append(num_tokens)
        return chunks
