"""Exact scheduling decisions: admission, KV reservation, chunked prefill, abort, finishing (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncrl.engine.scheduler import Scheduler, SlotMove
from asyncrl.engine.sequence import Sequence, SequenceStatus
from asyncrl.types import FinishReason, Request, SamplingParams


def seq(rid: str, num_prompt: int, max_new_tokens: int = 10) -> Sequence:
    req = Request(
        request_id=rid,
        prompt_token_ids=list(range(num_prompt)),
        sampling=SamplingParams(max_new_tokens=max_new_tokens),
    )
    return Sequence.from_request(req, engine_seed=0)


def scheduler(**kw) -> Scheduler:
    args = {
        "max_running_requests": 2,
        "max_kv_tokens": 100,
        "max_prefill_tokens_per_step": 8,
        "max_model_len": 64,
    }
    return Scheduler(**{**args, **kw})


def chunks_of(s: Scheduler):
    moves, chunks = s.schedule()
    assert moves == []
    return chunks


def plan(chunks) -> list[tuple[str, int, int]]:
    return [(c.seq.request_id, c.start, c.num_tokens) for c in chunks]


def test_scheduler_does_not_import_torch():
    code = "import sys, asyncrl.engine.scheduler; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_admission_respects_max_running_and_assigns_lowest_slots():
    s = scheduler(max_running_requests=2)
    a, b, c = seq("a", 3), seq("b", 3), seq("c", 3)
    for x in (a, b, c):
        s.add(x)
    assert plan(chunks_of(s)) == [("a", 0, 3), ("b", 0, 3)]
    assert (a.slot, b.slot, c.slot) == (0, 1, None)
    assert [x.request_id for x in s.waiting] == ["c"]
    assert s.kv_tokens_reserved == 26


def test_kv_budget_blocks_head_of_queue_first_come_first_served():
    s = scheduler(max_running_requests=4, max_kv_tokens=40)
    big, small = seq("big", 20, max_new_tokens=15), seq("small", 2, max_new_tokens=2)
    first = seq("first", 5, max_new_tokens=10)
    for x in (first, big, small):
        s.add(x)
    assert plan(chunks_of(s)) == [("first", 0, 5)]  # 15 + 35 > 40: big waits, and small waits behind it
    assert s.kv_tokens_reserved == 15
    s.finish(first, FinishReason.STOP)
    assert plan(chunks_of(s)) == [("big", 0, 8)]  # small is admitted too but the prefill budget is spent
    assert [x.request_id for x in s.running] == ["big", "small"]
    assert s.kv_tokens_reserved == 39


def test_reservation_is_capped_by_max_model_len_and_oversized_requests_are_rejected():
    s = scheduler(max_model_len=20, max_kv_tokens=19)
    assert s.reservation(seq("a", 5, max_new_tokens=100)) == 20
    with pytest.raises(ValueError, match="request a: needs 20 KV tokens"):
        s.add(seq("a", 5, max_new_tokens=100))


def test_prefill_is_chunked_within_budget_while_decodes_always_advance():
    s = scheduler(max_running_requests=3, max_prefill_tokens_per_step=8)
    a = seq("a", 1)
    s.add(a)
    assert plan(chunks_of(s)) == [("a", 0, 1)]
    assert s.commit(chunks_of(s)) == [a]  # nothing committed yet: same plan again, a samples
    a.append(7, -1.0, 0)
    b, c = seq("b", 10), seq("c", 5)
    s.add(b)
    s.add(c)
    chunks = chunks_of(s)
    assert plan(chunks) == [("a", 1, 1), ("b", 0, 8)]
    assert s.commit(chunks) == [a]
    a.append(8, -1.0, 0)
    chunks = chunks_of(s)
    assert plan(chunks) == [("a", 2, 1), ("b", 8, 2), ("c", 0, 5)]
    assert s.commit(chunks) == [a, b, c]
    assert (b.num_cached, c.num_cached) == (10, 5)


def test_abort_releases_slot_and_budget_and_is_idempotent():
    s = scheduler()
    a, b = seq("a", 4), seq("b", 4)
    s.add(a)
    s.add(b)
    chunks_of(s)
    assert s.abort("a") is a
    assert (a.status, a.finish_reason, a.slot) == (SequenceStatus.FINISHED, FinishReason.ABORT, None)
    assert s.abort("a") is None
    assert s.kv_tokens_reserved == 14
    c = seq("c", 4)
    s.add(c)
    assert s.abort("c") is c  # aborting a waiting request
    s.add(seq("d", 4))
    chunks_of(s)
    assert s.running[-1].slot == 0  # a's slot is reused
    assert s.num_slots_in_use == 2


def test_reset_kv_replans_whole_context():
    s = scheduler(max_prefill_tokens_per_step=100)
    a = seq("a", 4)
    s.add(a)
    s.commit(chunks_of(s))
    a.append(9, -1.0, 0)
    assert plan(chunks_of(s)) == [("a", 4, 1)]
    s.reset_kv()
    assert plan(chunks_of(s)) == [("a", 0, 5)]
    assert s.kv_tokens_cached == 0


def test_prefix_tokens_count_towards_context_and_the_sampling_seed():
    req = Request(
        request_id="r",
        prompt_token_ids=[1, 2],
        prefix_token_ids=[3, 4, 5],
        prefix_logprobs=[-1.0, -2.0, -3.0],
        prefix_versions=[0, 0, 1],
    )
    resumed = Sequence.from_request(req, engine_seed=7)
    fresh = Sequence.from_request(Request(request_id="r", prompt_token_ids=[1, 2]), engine_seed=7)
    assert (resumed.num_tokens, resumed.num_output_tokens, resumed.num_pending) == (5, 3, 5)
    assert resumed.sample_seed == fresh.sample_seed  # the engine draws the resumed one at output position 3


def test_slots_are_compacted_when_requests_end_and_nothing_waits():
    s = scheduler(max_running_requests=4, max_prefill_tokens_per_step=100)
    seqs = [seq(rid, 3) for rid in "abcd"]
    for x in seqs:
        s.add(x)
    for x in s.commit(chunks_of(s)):
        x.append(1, -1.0, 0)
    s.finish(seqs[0], FinishReason.STOP)
    s.finish(seqs[2], FinishReason.STOP)
    moves, chunks = s.schedule()
    assert moves == [SlotMove(src=3, dst=0, num_positions=3)]
    assert (seqs[1].slot, seqs[3].slot, s.num_slots_in_use) == (1, 0, 2)
    assert plan(chunks) == [("b", 3, 1), ("d", 3, 1)]
    s.add(seq("e", 3))
    moves, _ = s.schedule()
    assert moves == [] and s.running[-1].slot == 2  # a waiting request fills the hole instead
