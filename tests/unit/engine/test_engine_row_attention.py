"""Attention over the lengths that exist: each decode row attends over its own context's bucket, not the
batch's longest, with the same tokens as before on both the static and the dynamic path."""

from __future__ import annotations

import copy
import random
from itertools import pairwise

import pytest
from engine_testlib import drain, engine, hf_greedy, request

from asyncrl.engine.decode_plan import (
    MIN_LENGTH_BUCKET,
    attention_groups,
    attention_positions,
    batch_buckets,
    length_bucket,
    length_levels,
)
from asyncrl.engine.scheduler import Scheduler, SlotMove, SlotSwap
from asyncrl.engine.sequence import Sequence
from asyncrl.types import FinishReason, Request, SamplingParams

MAX_LEN = 300
"""Levels 64, 128, 256 and the pool's 300: a top level that is not a power of two."""


def _ladder(batch: int):
    return lambda rows: next(b for b in batch_buckets(batch) if b >= rows)


def test_levels_climb_from_the_smallest_bucket_to_the_pool():
    assert length_levels(MAX_LEN) == [64, 128, 256, 300]
    assert length_levels(MIN_LENGTH_BUCKET) == [MIN_LENGTH_BUCKET]
    assert length_levels(40) == [40]


def test_groups_tile_the_batch_and_cover_every_row():
    rng = random.Random(0)
    for _ in range(500):
        batch = rng.randint(1, 40)
        needs = [rng.choice([1, rng.randint(1, MAX_LEN)]) for _ in range(batch)]
        for pad in (None, _ladder(batch)):
            groups = attention_groups(needs, MAX_LEN, pad_rows=pad)
            assert groups[0][0] == 0 and groups[-1][1] == batch
            assert all(a[1] == b[0] for a, b in pairwise(groups))
            for start, end, length in groups:
                assert start < end and max(needs[start:end]) <= length <= MAX_LEN
                if pad is not None:  # static: a level, so the shape is one of a few
                    assert length in length_levels(MAX_LEN)


def test_sorted_rows_pay_their_own_buckets():
    """Rows ordered longest first (what the scheduler keeps): the dynamic plan reads at most the sum of the
    rows' own buckets, the static one at most twice that (each level's row count rounds up at most 2x)."""
    rng = random.Random(1)
    for _ in range(500):
        batch = rng.randint(1, 64)
        needs = sorted((rng.randint(1, MAX_LEN) for _ in range(batch)), reverse=True)
        own = sum(length_bucket(need, MAX_LEN) for need in needs)
        assert attention_positions(attention_groups(needs, MAX_LEN)) <= own
        assert attention_positions(attention_groups(needs, MAX_LEN, pad_rows=_ladder(batch))) <= 2 * own


def test_a_long_tailed_batch_pays_for_its_long_row_once():
    needs = [2048] + [100] * 63
    static = attention_groups(needs, 4096, pad_rows=_ladder(64))
    assert static == ((0, 1, 2048), (1, 64, 128))
    assert attention_positions(static) == 2048 + 63 * 128  # 10,112 positions, not 64 x 2048 = 131,072
    assert attention_groups(needs, 4096) == ((0, 1, 2048), (1, 64, 100))


def _seq(rid: str, prompt: int, max_new_tokens: int) -> Sequence:
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    req = Request(request_id=rid, prompt_token_ids=list(range(prompt)), sampling=sampling)
    return Sequence.from_request(req, engine_seed=0)


def test_the_scheduler_keeps_longer_buckets_in_lower_slots_and_kv_follows_its_request():
    """Random arrivals, prompt lengths, decode and finishes: after every schedule the slots are compact, the
    buckets never increase with the slot, and replaying the moves and swaps on a model of the pool leaves
    every request's KV in its own slot."""
    rng = random.Random(2)
    for trial in range(30):
        slots = rng.randint(1, 8)
        s = Scheduler(
            max_running_requests=slots,
            max_kv_tokens=10_000,
            max_prefill_tokens_per_step=200,
            max_model_len=MAX_LEN,
        )
        pool: list[str | None] = [None] * slots  # whose KV each slot holds
        pending = [_seq(f"{trial}-{i}", rng.randint(1, 250), rng.randint(1, 120)) for i in range(12)]
        for _ in range(400):
            if pending and rng.random() < 0.3:
                s.add(pending.pop())
            if not s.has_work:
                break
            moves, chunks = s.schedule()
            for move in moves:
                if isinstance(move, SlotSwap):
                    pool[move.a], pool[move.b] = pool[move.b], pool[move.a]
                else:
                    assert isinstance(move, SlotMove)
                    pool[move.dst] = pool[move.src]
            by_slot = sorted(s.running, key=lambda x: x.slot)
            assert [x.slot for x in by_slot] == list(range(len(by_slot)))
            buckets = [length_bucket(min(x.num_tokens, MAX_LEN), MAX_LEN) for x in by_slot]
            assert buckets == sorted(buckets, reverse=True)
            assert all(pool[x.slot] == x.request_id for x in by_slot if x.num_cached)
            for chunk in chunks:  # the step writes each chunk's KV into its request's slot
                pool[chunk.seq.slot] = chunk.seq.request_id
            for x in s.commit(chunks):
                x.append(5, -1.0, 0)
                if x.num_output_tokens >= x.request.sampling.max_new_tokens or x.num_tokens >= MAX_LEN:
                    s.finish(x, FinishReason.LENGTH)


def _mixed_requests():
    """Prompts in every level (10 to 250 tokens) whose outputs cross 64, 128 and 256 and stop at the pool's
    300, more requests than slots so that admissions land between running rows; odd ones sampled."""
    prompts = [250, 10, 120, 60, 200, 40, 100, 5]
    new_tokens = [60, 70, 20, 10, 70, 100, 40, 130]
    out = []
    for i, (prompt, n) in enumerate(zip(prompts, new_tokens, strict=True)):
        ids = [(11 * i + j) % 90 + 3 for j in range(prompt)]
        sampling = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
        if i % 2:
            sampling.update(temperature=0.8, seed=200 + i)
        out.append(request(str(i), ids, **sampling))
    return out


def _run_mixed(model, mode: str):
    core = engine(
        copy.deepcopy(model),
        decode_graphs=mode,
        max_running_requests=5,
        max_kv_tokens=4096,
        max_prefill_tokens_per_step=128,
        max_model_len=MAX_LEN,
    )
    plans = []
    decode = core.runner._decode_rows

    def recording(inputs, groups):
        plans.append(groups)
        return decode(inputs, groups)

    core.runner._decode_rows = recording
    if core.runner.static is not None:
        core.runner.static.decode = recording
    for req in _mixed_requests():
        core.add_request(req)
    return drain(core), plans


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_per_row_lengths_match_across_paths_at_every_level(family, request):
    model = request.getfixturevalue(family)
    dynamic, dynamic_plans = _run_mixed(model, "off")
    static, static_plans = _run_mixed(model, "on")
    levels = {length for plan in static_plans for _, _, length in plan}
    assert levels == set(length_levels(MAX_LEN))
    assert max(len(plan) for plan in static_plans) >= 3  # rows of three levels in one step
    assert max(len(plan) for plan in dynamic_plans) >= 3
    assert static.keys() == dynamic.keys() == {r.request_id for r in _mixed_requests()}
    for rid, expected in dynamic.items():
        assert static[rid].token_ids == expected.token_ids, rid
        assert static[rid].logprobs == pytest.approx(expected.logprobs, abs=1e-4), rid
        assert static[rid].finish_reason == expected.finish_reason, rid
    for req in _mixed_requests():
        if req.sampling.temperature == 0:
            got = dynamic[req.request_id].token_ids
            assert got == hf_greedy(model, req.prompt_token_ids, len(got)), req.request_id


@pytest.mark.parametrize("mode", ["off", "on"])
def test_attention_work_follows_the_rows_own_buckets(qwen2, mode):
    """One request at ~2k context beside 63 at 100, the long one admitted last (the highest slot): the
    scheduler moves it to slot 0, and a decode step's counted attention work is about the sum of the rows'
    own buckets (2,048 + 63 x 128), not 64 rows x 2,048."""
    core = engine(
        copy.deepcopy(qwen2),
        decode_graphs=mode,
        max_running_requests=64,
        max_kv_tokens=64 * 2100,
        max_prefill_tokens_per_step=10_000,
        max_model_len=2100,
    )
    for i in range(63):
        core.add_request(
            request(f"short{i}", [3 + i % 50] * 99, temperature=0, max_new_tokens=4, ignore_eos=True)
        )
    core.add_request(request("long", [7] * 2000, temperature=0, max_new_tokens=4, ignore_eos=True))
    core.step()  # every prompt prefilled, each row's first token sampled
    assert core.runner.decode_attention_positions == 0
    core.step()  # one decode step: the short rows at position 100, the long one at 2,000
    assert core._sequences["long"].slot == 0
    work = core.runner.decode_attention_positions
    own_buckets = 2048 + 63 * 128
    assert 2001 + 63 * 100 <= work <= own_buckets
    assert work * 10 < 64 * 2048
