"""Which requests run at each engine step, and how many of their pending tokens each one feeds (no torch).

Admission (``asyncrl.engine.admission``, shared with the simulator's engine) reserves KV up front: a request enters the running batch only when a slot is free
(``max_running_requests``) and its worst-case length, ``min(prompt + max_new_tokens, max_model_len)``, fits in
what is left of ``max_kv_tokens``. A running request therefore never runs out of KV and is never preempted;
the price is that short outputs hold more budget than they use. Waiting requests are admitted strictly first
come, first served, so a large request at the head of the queue is not starved by small ones behind it.

Slots stay compact: when requests end and nothing waits to take their slots, the requests in the highest
slots move down into the free ones (a one-off copy of their KV), so a decode step spans exactly as many slots
as there are running requests, even in the long tail where a few long requests outlive all the others.

Slots stay ordered by context length too, at bucket granularity: after compaction, requests swap slots (a
one-off exchange of their KV) so that those whose context falls in a longer KV-length bucket
(``decode_plan.length_bucket``) hold lower slots. A decode step's attention groups (``decode_plan``) then
split the batch into one contiguous range per bucket, and each row attends over its own bucket rather than
the batch's longest. Order changes only when a request is admitted, ends, or crosses a bucket boundary, so
the swaps are rare beside the decode steps they shorten.

Each step every running request in decode (one pending token) advances by one token, and requests still in
prefill share ``max_prefill_tokens_per_step`` tokens in admission order (chunked prefill), so new prompts are
prefilled between decode steps without stalling the running batch.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from asyncrl.engine.admission import AdmissionPolicy
from asyncrl.engine.decode_plan import length_bucket
from asyncrl.engine.sequence import Sequence, SequenceStatus
from asyncrl.types import FinishReason


@dataclass(frozen=True)
class SlotMove:
    """Copy the first ``num_positions`` KV positions of slot ``src`` to slot ``dst`` before this step runs."""

    src: int
    dst: int
    num_positions: int


@dataclass(frozen=True)
class SlotSwap:
    """Exchange the first ``num_positions`` KV positions of slots ``a`` and ``b`` before this step runs."""

    a: int
    b: int
    num_positions: int


@dataclass(frozen=True)
class Chunk:
    """``num_tokens`` pending tokens of ``seq`` starting at position ``start``, fed to the model this step."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def completes(self) -> bool:
        """True when the chunk reaches the end of the sequence, so its last logits yield the next token."""
        return self.start + self.num_tokens == self.seq.num_tokens


class Scheduler:
    """Admission, the per-step token plan, abort and finishing over a waiting queue and a running list."""

    def __init__(
        self,
        *,
        max_running_requests: int,
        max_kv_tokens: int,
        max_prefill_tokens_per_step: int,
        max_model_len: int,
    ) -> None:
        self.policy = AdmissionPolicy(
            max_running_requests=max_running_requests,
            max_kv_tokens=max_kv_tokens,
            max_prefill_tokens_per_step=max_prefill_tokens_per_step,
            max_model_len=max_model_len,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_tokens_reserved = 0
        self._free_slots = list(range(max_running_requests))

    def reservation(self, seq: Sequence) -> int:
        """KV tokens held for ``seq`` while it runs: its longest possible length."""
        return self.policy.reservation(seq.num_prompt_tokens, seq.request.sampling.max_new_tokens)

    def add(self, seq: Sequence) -> None:
        self.policy.check_fits(seq.request_id, self.reservation(seq))
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[SlotMove | SlotSwap], list[Chunk]]:
        """Admit what fits, compact the slots and order them by length, then plan this step: one token per
        decoding request, prefill chunks within budget. The moves are applied in order before the step."""
        self._admit()
        moves: list[SlotMove | SlotSwap] = [*self._compact(), *self._order_by_length()]
        prefilling = (seq.num_pending for seq in self.running if seq.num_pending > 1)
        prefill_sizes = iter(self.policy.prefill_chunks(prefilling))
        chunks = []
        for seq in self.running:
            assert seq.num_pending >= 1, f"request {seq.request_id} has no token to feed"
            num_tokens = 1 if seq.num_pending == 1 else next(prefill_sizes)
            if num_tokens:
                chunks.append(Chunk(seq, seq.num_cached, num_tokens))
        return moves, chunks

    def commit(self, chunks: list[Chunk]) -> list[Sequence]:
        """Record that the chunks' KV is now cached; return the sequences that must sample a token."""
        for chunk in chunks:
            chunk.seq.num_cached = chunk.start + chunk.num_tokens
        return [chunk.seq for chunk in chunks if chunk.completes]

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a running or waiting sequence and give back its slot and KV reservation."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def abort(self, request_id: str) -> Sequence | None:
        """Finish the request with ``abort`` wherever it is; None if it is not here (unknown or already ended)."""
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                self.finish(seq, FinishReason.ABORT)
                return seq
        return None

    def reset_kv(self) -> None:
        """Forget every running request's KV, so its whole context is prefilled again (weights changed)."""
        for seq in self.running:
            seq.num_cached = 0

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def kv_tokens_cached(self) -> int:
        return sum(seq.num_cached for seq in self.running)

    @property
    def num_slots_in_use(self) -> int:
        """One past the highest slot held: decode batches span slots ``[0, num_slots_in_use)``."""
        return max((seq.slot for seq in self.running), default=-1) + 1

    def _admit(self) -> None:
        num_admitted = self.policy.num_admitted(
            map(self.reservation, self.waiting),
            num_running=len(self.running),
            kv_reserved=self.kv_tokens_reserved,
        )
        for _ in range(num_admitted):
            head = self.waiting.popleft()
            head.slot = heapq.heappop(self._free_slots)
            head.status = SequenceStatus.RUNNING
            self.kv_tokens_reserved += self.reservation(head)
            self.running.append(head)

    def _compact(self) -> list[SlotMove]:
        """Move the requests in the highest slots into the lowest free ones until slots 0..n-1 are in use."""
        moves = []
        while self.running and self.num_slots_in_use > len(self.running):
            seq = max(self.running, key=lambda s: s.slot)
            dst = heapq.heappop(self._free_slots)
            moves.append(SlotMove(seq.slot, dst, seq.num_cached))
            heapq.heappush(self._free_slots, seq.slot)
            seq.slot = dst
        return moves

    def _order_by_length(self) -> list[SlotMove | SlotSwap]:
        """Swap slots until the requests' length buckets do not increase with the slot (module docstring).

        A request's bucket is that of its whole context (prompt and output so far), what its next decode
        step attends over; one still in prefill is placed by the context it is filling. Bucket by bucket,
        longest first, the bucket's requests take the next run of slots: each one outside that run swaps
        with a request inside it that belongs elsewhere, so a request already in place never moves. Runs
        after ``_compact``: slots are ``0..n-1``, so a request's index in slot order is its slot. Where one
        of the two has no KV yet (just admitted), the other's is moved rather than exchanged."""
        max_len = self.policy.max_model_len
        bucket = {seq: length_bucket(min(seq.num_tokens, max_len), max_len) for seq in self.running}
        by_slot = sorted(self.running, key=lambda s: s.slot)
        if all(bucket[x] >= bucket[y] for x, y in pairwise(by_slot)):
            return []
        moves: list[SlotMove | SlotSwap] = []
        start = 0
        for level in sorted(set(bucket.values()), reverse=True):
            end = start + sum(1 for seq in by_slot if bucket[seq] == level)
            intruders = [i for i in range(start, end) if bucket[by_slot[i]] != level]
            outsiders = [i for i in range(end, len(by_slot)) if bucket[by_slot[i]] == level]
            for i, j in zip(intruders, outsiders, strict=True):
                inside, outside = by_slot[i], by_slot[j]
                if inside.num_cached and outside.num_cached:
                    moves.append(SlotSwap(i, j, max(inside.num_cached, outside.num_cached)))
                elif inside.num_cached or outside.num_cached:
                    src, dst, moved = (i, j, inside) if inside.num_cached else (j, i, outside)
                    moves.append(SlotMove(src, dst, moved.num_cached))
                inside.slot, outside.slot = j, i
                by_slot[i], by_slot[j] = outside, inside
            start = end
        return moves

    def _release(self, seq: Sequence) -> None:
        assert seq.slot is not None, f"running request {seq.request_id} holds no slot"
        heapq.heappush(self._free_slots, seq.slot)
        self.kv_tokens_reserved -= self.reservation(seq)
        seq.slot = None
        seq.num_cached = 0
