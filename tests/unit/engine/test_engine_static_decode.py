"""Decode at bucketed static shapes (``engine.decode_graphs: on``; eager on CPU, captured on CUDA) gives the
dynamic path's tokens, token for token, as batches and contexts cross every bucket boundary."""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from engine_testlib import drain, engine, hf_greedy, request

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import static_decode
from asyncrl.engine.decode_plan import MIN_LENGTH_BUCKET, batch_buckets, length_bucket
from asyncrl.engine.model_runner import grouped_attention
from asyncrl.engine.static_decode import StaticDecode

NUM_SLOTS = 9
"""Buckets 1, 2, 3, 4, 6, 8, 9: the half-octave ladder and a slot count that is not on it."""


def test_batch_buckets_end_at_the_slot_count():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 3, 4, 6, 8]
    assert batch_buckets(9) == [1, 2, 3, 4, 6, 8, 9]


def test_length_buckets_are_powers_of_two_then_half_octaves_capped_by_the_pool():
    assert length_bucket(1, 1000) == MIN_LENGTH_BUCKET
    assert length_bucket(MIN_LENGTH_BUCKET, 1000) == MIN_LENGTH_BUCKET
    assert length_bucket(MIN_LENGTH_BUCKET + 1, 1000) == 2 * MIN_LENGTH_BUCKET
    assert length_bucket(700, 1000) == 1000
    assert length_bucket(30, 40) == 40
    assert length_bucket(2048, 10_000) == 2048
    assert length_bucket(2049, 10_000) == 3072
    assert length_bucket(3073, 10_000) == 4096
    assert length_bucket(4097, 10_000) == 6144
    assert length_bucket(6145, 7000) == 7000
    with pytest.raises(ValueError, match="decode length 41"):
        length_bucket(41, 40)


def test_decode_graphs_setting_is_checked():
    with pytest.raises(ValueError, match="engine.decode_graphs"):
        EngineConfig(decode_graphs="yes")


def _requests():
    """Nine requests finishing one after another (the batch shrinks through every bucket after growing
    through them while prompts are prefilled), contexts from 30 to 128 tokens (across the 64 bucket, up to
    the pool's length); odd ones sampled with their own seed and truncation."""
    out = []
    for i in range(NUM_SLOTS):
        prompt = [(7 * i + j) % 90 + 3 for j in range(30 + 3 * i)]
        sampling = {"temperature": 0, "max_new_tokens": 8 + 9 * i, "ignore_eos": True}
        if i % 2:
            sampling.update(temperature=0.8, seed=100 + i, top_p=0.9 if i % 4 == 1 else 1.0)
        out.append(request(str(i), prompt, **sampling))
    return out


def _run(model, mode: str, **config):
    core = engine(
        copy.deepcopy(model),
        decode_graphs=mode,
        max_running_requests=NUM_SLOTS,
        max_kv_tokens=4096,
        max_prefill_tokens_per_step=64,
        **config,
    )
    shapes: set[tuple[int, int]] = set()  # (batch, a group's KV length)
    if core.runner.static is not None:
        decode = core.runner.static.decode

        def recording(inputs, groups):
            shapes.update((inputs.shape[1], length) for _, _, length in groups)
            return decode(inputs, groups)

        core.runner.static.decode = recording
    for req in _requests():
        core.add_request(req)
    return drain(core), shapes


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("max_model_len", [None, 100])
def test_static_shapes_match_the_dynamic_path_at_every_bucket(family, max_model_len, request):
    model = request.getfixturevalue(family)
    dynamic, _ = _run(model, "off", max_model_len=max_model_len)
    static, shapes = _run(model, "on", max_model_len=max_model_len)
    max_len = max_model_len or model.config.max_position_embeddings
    if max_model_len is None:  # with 100, the last four requests all stop at the pool's length at once
        assert {batch for batch, _ in shapes} == set(batch_buckets(NUM_SLOTS))
    assert {length for _, length in shapes} == {MIN_LENGTH_BUCKET, max_len}
    assert static.keys() == dynamic.keys()
    for rid, expected in dynamic.items():
        assert static[rid].token_ids == expected.token_ids, rid
        assert static[rid].logprobs == pytest.approx(expected.logprobs, abs=1e-4), rid
        assert static[rid].finish_reason == expected.finish_reason


def test_static_greedy_matches_hf(qwen2):
    out, _ = _run(qwen2, "on")
    for req in _requests():
        if req.sampling.temperature == 0:
            expected = hf_greedy(qwen2, req.prompt_token_ids, len(out[req.request_id].token_ids))
            assert out[req.request_id].token_ids == expected


@pytest.mark.parametrize("width", [1, 5], ids=["decode", "prefill"])
def test_grouped_attention_matches_sdpa_with_gqa(width):
    """The grouped layout computes what ``enable_gqa`` with a ``[rows, 1, width, length]`` mask computes (the
    prefill's call before it): each query head reads KV head ``h // group``, each position its own mask row."""
    torch.manual_seed(0)
    rows, heads, kv_heads, length, head_dim = 3, 8, 2, 10, 16
    q = torch.randn(rows, width, heads, head_dim).transpose(1, 2)  # the runner's layout: a transposed view
    keys, values = torch.randn(2, rows, kv_heads, length, head_dim)
    last = torch.tensor([[2], [9], [4]]) + torch.arange(width)[None, :] - (width - 1)
    mask = torch.arange(length)[None, None, :] <= last.clamp(min=0)[:, :, None]  # [rows, width, length]
    expected = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask[:, None], enable_gqa=True, scale=0.3
    )
    grouped_mask = mask[:, :1] if width == 1 else mask.repeat(1, heads // kv_heads, 1)
    got = grouped_attention(q, keys, values, grouped_mask, 0.3)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-6)


def test_a_failed_capture_falls_back_to_eager_static_shapes(monkeypatch):
    seen = []

    def decode(inputs, groups):
        seen.append((inputs.shape[1], groups))
        return inputs[0, :, None].float().expand(-1, 5).clone()

    static = StaticDecode(
        decode, num_slots=4, max_len=100, device=torch.device("cpu"), capture=False, fingerprint=tuple
    )
    static.capture = True  # as on CUDA, with a capture that fails

    def failing_capture(batch, groups):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(static, "_capture", failing_capture)
    logits = static.run([7, 9, 11], [3, 4, 5], [3, 4, 5])
    assert "not permitted" in static.capture_error
    assert logits[:, 0].tolist() == [7, 9, 11]  # 3 is a batch bucket: no padded row
    assert seen == [(3, ((0, 3, MIN_LENGTH_BUCKET),))]
    static.run([1], [0], [0])
    assert seen[-1] == (1, ((0, 1, MIN_LENGTH_BUCKET),))
    assert static.stats()["decode_capture_failures_other"] == 1  # one failure turned every shape eager


def test_captures_are_counted_once_per_shape_and_again_after_the_addresses_move(monkeypatch):
    """``captures`` and ``capture_s`` are what the GPU kit reports: one capture per new (batch, groups) key,
    none for a replay, one more for a key recaptured because the pool or the weights moved."""
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", FakeCuda().graph_pool_handle)  # the recapture's
    addresses = [(1,)]
    static = StaticDecode(
        lambda inputs, groups: None,
        num_slots=4,
        max_len=100,
        device=torch.device("cpu"),
        capture=False,
        fingerprint=lambda: addresses[0],
    )
    static.capture = True  # as on CUDA, with a capture that records instead of capturing
    captured = []

    def fake_capture(batch, groups):
        captured.append((batch, groups))
        static.logits = torch.zeros(4, 5)
        return types.SimpleNamespace(replay=lambda: None)

    monkeypatch.setattr(static, "_capture", fake_capture)
    static.run([7], [3], [3])
    static.run([7], [4], [4])  # the same key: a replay
    static.run([7, 9, 11], [3, 4, 5], [3, 4, 5])
    assert static.captures == 2 == len(static.graphs) and static.capture_s > 0
    addresses[0] = (2,)
    static.run([7], [5], [5])
    assert static.captures == 3 and len(static.graphs) == 1
    assert captured[0] == captured[2] == (1, ((0, 1, MIN_LENGTH_BUCKET),))


def test_sleep_drops_the_captured_graphs_and_decode_goes_on_after_wake(qwen2):
    """A sleeping engine frees its KV pool; graphs captured over it would pin their pool and point into freed
    memory, so sleep drops them and the first step after wake runs (and would capture) again."""
    core = engine(copy.deepcopy(qwen2), decode_graphs="on", max_running_requests=NUM_SLOTS)
    prompt = [5, 6, 7, 8]
    core.add_request(request("before", prompt, temperature=0, max_new_tokens=5, ignore_eos=True))
    before = drain(core)["before"].token_ids
    core.runner.static.graphs[1, ((0, 1, MIN_LENGTH_BUCKET),)] = object()  # what a CUDA capture leaves behind
    core.sleep(1)
    assert core.runner.static.graphs == {} and core.runner.static.logits is None
    core.wake()
    core.add_request(request("after", prompt, temperature=0, max_new_tokens=5, ignore_eos=True))
    assert drain(core)["after"].token_ids == before


class FakeCuda:
    """The stream bookkeeping of ``torch.cuda`` on CPU: a current stream that ``stream(s)`` sets and restores
    as torch's ``StreamContext`` does, and a ``CUDAGraph`` whose ``capture_end`` fails (recording the stream
    its capture began on), so that torch's own ``torch.cuda.graph`` context runs over them unchanged."""

    def __init__(self, *, capture_end_fails: bool = True) -> None:
        self.current = types.SimpleNamespace(name="caller", wait_stream=lambda other: None)
        self.capture_streams: list[object] = []
        self.pools = 0
        self.capture_end_fails = capture_end_fails
        self.recording: set[tuple[int, int]] = set()
        """Pools the allocator routes a capture's allocations to (``beginAllocateToPool`` .. ``end``)."""
        self.released: list[tuple[int, int]] = []
        self.graphs: list[object] = []

    def install(self, monkeypatch) -> None:
        fake = self

        class Graph:
            def capture_begin(self, *pool, **modes):
                fake.capture_streams.append(fake.current)
                fake.graphs.append(self)
                self.pool = pool[0]
                fake.recording.add(self.pool)

            def capture_end(self):
                # as CUDAGraph.cpp: the stream's capture ends (and may fail) before the allocator's does
                if fake.capture_end_fails:
                    raise RuntimeError("operation failed due to a previous error during capture")
                fake.recording.remove(self.pool)

            def replay(self):
                pass

        def end_allocate_to_pool(device, pool):
            if pool not in fake.recording:
                raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
            fake.recording.remove(pool)

        for name, value in {
            "current_stream": lambda device=None: self.current,
            "stream": self.stream,
            "Stream": lambda device=None: types.SimpleNamespace(name="side", wait_stream=lambda other: None),
            "CUDAGraph": Graph,
            "graph_pool_handle": self.graph_pool_handle,
            "synchronize": lambda device=None: None,
            "empty_cache": lambda: None,
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: None, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end_allocate_to_pool, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda device, pool: self.released.append(pool))

    def graph_pool_handle(self) -> tuple[int, int]:
        self.pools += 1
        return (0, self.pools)

    def stream(self, stream) -> FakeStreamContext:
        return FakeStreamContext(self, stream)


class FakeStreamContext:
    """torch's ``StreamContext`` over ``FakeCuda``: the previous stream comes back only if ``__exit__`` runs
    (a generator's ``finally`` would also run when it is collected, hiding a context never exited)."""

    def __init__(self, cuda: FakeCuda, stream) -> None:
        self.cuda, self.stream = cuda, stream

    def __enter__(self) -> None:
        self.previous, self.cuda.current = self.cuda.current, self.stream

    def __exit__(self, *exc) -> None:
        self.cuda.current = self.previous


def capturing_over(cuda: FakeCuda, decode) -> StaticDecode:
    """A static decode that captures, as on CUDA, over ``cuda``'s fake streams: its own capture stream and a
    graph pool from the fake."""
    static = StaticDecode(
        decode, num_slots=4, max_len=100, device=torch.device("cpu"), capture=False, fingerprint=tuple
    )
    static.capture = True
    static._stream = types.SimpleNamespace(name="engine capture")
    static._pool = cuda.graph_pool_handle()
    return static


def test_graphs_over_moved_addresses_are_captured_again_into_a_fresh_pool(monkeypatch):
    """A LoRA update that changes the adapters' layout (or anything else the graphs read moving) drops the
    graphs, and the next capture takes a fresh graph pool, never the old one: that pool may keep a block for
    good (the capture stream's cuBLAS workspace, allocated inside its first capture), and PyTorch asserts in
    ``create_or_incref_pool`` on a capture into a pool that no graph holds any more but whose blocks live on;
    with the old pool reused, the engine turned capturing off for its life at its first adapter update."""
    cuda = FakeCuda(capture_end_fails=False)
    cuda.install(monkeypatch)
    static = capturing_over(cuda, lambda inputs, groups: inputs[0, :, None].float().expand(-1, 5).clone())
    layout = [(1,)]
    static.fingerprint = lambda: layout[0]
    static.run([7], [3], [3])
    static.run([7, 9], [3, 4], [3, 4])  # a second shape shares the first one's pool
    layout[0] = (2,)
    static.run([7], [3], [3])
    first, second, third = (graph.pool for graph in cuda.graphs)
    assert first == second != third and static._pool == third
    assert static.captures == 3 and len(static.graphs) == 1 and static.capture_error is None


def test_a_failed_capture_leaves_the_callers_stream_current_and_decodes_eagerly(monkeypatch):
    """torch's ``graph`` context leaves its capture stream only when ``capture_end`` succeeds: after a failed
    capture the eager fallback must still run on the engine thread's own stream, not the capture stream."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    ran_on = []

    def decode(inputs, groups):
        ran_on.append(cuda.current.name)
        return inputs[0, :, None].float().expand(-1, 5).clone()

    static = capturing_over(cuda, decode)
    first_pool = static._pool
    logits = static.run([7, 9], [3, 4], [3, 4])
    assert "previous error during capture" in static.capture_error
    assert cuda.recording == set() and cuda.released == [first_pool] != [static._pool]  # allocator left clean
    assert [stream.name for stream in cuda.capture_streams] == ["engine capture"]  # its own, not torch's
    assert cuda.current.name == "caller"
    assert ran_on == ["side", "side", "engine capture", "caller"]  # warm-ups, capture, eager fallback
    assert logits[:, 0].tolist() == [7, 9]


def test_release_takes_a_fresh_graph_pool(monkeypatch):
    """Captures after a sleep never share a pool with graphs captured before it (whose blocks may survive)."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    static = StaticDecode(
        lambda inputs, groups: None,
        num_slots=4,
        max_len=100,
        device=torch.device("cpu"),
        capture=False,
        fingerprint=tuple,
    )
    static.capture = True
    static._pool = before = cuda.graph_pool_handle()
    static.release()
    assert static._pool not in (None, before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_failed_cuda_capture_leaves_the_callers_stream_current(monkeypatch):
    """On a real device: a capture forced to fail after ``capture_end`` (so the device is left clean) falls
    back to eager decode on the caller's stream; each StaticDecode captures on its own stream."""

    class FailingGraph(torch.cuda.CUDAGraph):
        def capture_end(self):
            super().capture_end()
            raise RuntimeError("forced capture failure")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FailingGraph)
    capturing_on = []

    def decode(inputs, groups):
        if torch.cuda.is_current_stream_capturing():
            capturing_on.append(torch.cuda.current_stream())
        return inputs[0, :, None].float().expand(-1, 5).clone()

    device = torch.device("cuda", torch.cuda.current_device())
    caller = torch.cuda.current_stream(device)

    def make():
        return StaticDecode(decode, num_slots=4, max_len=100, device=device, capture=True, fingerprint=tuple)

    static, other = make(), make()
    logits = static.run([7, 9], [3, 4], [3, 4])
    assert static.capture_error == "RuntimeError: forced capture failure"
    assert torch.cuda.current_stream(device) == caller
    assert logits[:, 0].tolist() == [7, 9]
    assert capturing_on == [static._stream] and static._stream not in (other._stream, caller)


def test_a_capture_out_of_memory_leaves_only_its_shape_eager(monkeypatch):
    """The largest bucket runs out of memory while capturing: it decodes eagerly from then on (never retried),
    smaller shapes still capture, and the engine's stats count the failure by reason."""
    seen = []

    def decode(inputs, groups):
        seen.append(inputs.shape[1])
        return inputs[0, :, None].float().expand(-1, 5).clone()

    static = StaticDecode(
        decode, num_slots=4, max_len=100, device=torch.device("cpu"), capture=False, fingerprint=tuple
    )
    static.capture = True  # as on CUDA, with a capture that records, or runs out of memory at batch 4
    captured = []

    def capture(batch, groups):
        if batch == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        captured.append(batch)
        static.logits = torch.zeros(4, 5)
        return types.SimpleNamespace(replay=lambda: None)

    monkeypatch.setattr(static, "_capture", capture)
    logits = static.run([7, 9, 11, 13], [3, 4, 5, 6], [3, 4, 5, 6])
    assert logits[:, 0].tolist() == [7, 9, 11, 13] and seen == [4]  # eager at its bucket
    static.run([7], [3], [3])
    static.run([7, 9], [3, 4], [3, 4])
    static.run([7, 9, 11, 13], [3, 4, 5, 6], [3, 4, 5, 6])
    assert captured == [1, 2] and seen == [4, 4] and static.capture_error is None
    assert static.stats() == {
        "decode_graph_captures": 2,
        "decode_capture_failures_out_of_memory": 1,
        "decode_capture_failures_other": 0,
        "decode_shapes_eager": 1,
        "decode_captures_deferred": 0,
    }


def test_an_out_of_memory_inside_a_capture_keeps_the_pool_and_the_stream(monkeypatch):
    """Through torch's own ``graph`` context: the decode runs out of memory mid-capture, ``capture_end``
    succeeds (the capture stays valid, and ends the allocator's routing itself): nothing is released twice,
    the pool stays shared, the caller's stream is current, and the next shape captures."""
    cuda = FakeCuda(capture_end_fails=False)
    cuda.install(monkeypatch)
    capturing = []

    def decode(inputs, groups):
        if cuda.current.name == "engine capture":
            capturing.append(inputs.shape[1])
            if inputs.shape[1] == 2:
                raise torch.OutOfMemoryError("CUDA out of memory")
        return inputs[0, :, None].float().expand(-1, 5).clone()

    static = capturing_over(cuda, decode)
    pool = static._pool
    logits = static.run([7, 9], [3, 4], [3, 4])
    assert logits[:, 0].tolist() == [7, 9] and cuda.current.name == "caller"
    assert cuda.recording == set() and cuda.released == [] and static._pool == pool
    static.run([7], [3], [3])
    assert capturing == [2, 1] and list(static.graphs) == [(1, ((0, 1, MIN_LENGTH_BUCKET),))]
    assert static.stats()["decode_capture_failures_out_of_memory"] == 1 and static.capture_error is None


def test_an_out_of_memory_that_also_breaks_capture_end_still_counts_as_out_of_memory(monkeypatch):
    """``capture_end`` failing after the decode ran out of memory raises its own error, the out-of-memory
    error as its context: still that one shape left eager; the allocator's routing, which ``capture_end`` never
    ended, is ended, the failed graph's pool reference dropped, and the next shape captures into a fresh pool."""
    cuda = FakeCuda(capture_end_fails=True)
    cuda.install(monkeypatch)

    def decode(inputs, groups):
        if cuda.current.name == "engine capture" and inputs.shape[1] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return inputs[0, :, None].float().expand(-1, 5).clone()

    static = capturing_over(cuda, decode)
    pool = static._pool
    assert static.run([7, 9], [3, 4], [3, 4])[:, 0].tolist() == [7, 9]
    assert static.capture_error is None and static.eager_shapes == {(2, ((0, 2, MIN_LENGTH_BUCKET),))}
    assert cuda.recording == set() and cuda.released == [pool] and static._pool != pool
    assert static_decode.UNENDED_GRAPHS[-1] is cuda.graphs[0]  # the host allocator's filter points at it
    cuda.capture_end_fails = False
    static.run([7], [3], [3])
    assert static.captures == 1 and cuda.capture_streams[-1].name == "engine capture"


def test_engine_stats_report_decode_captures(qwen2):
    core = engine(copy.deepcopy(qwen2), decode_graphs="on", max_running_requests=2)
    assert core.stats()["decode_capture_failures_out_of_memory"] == 0
    assert "decode_graph_captures" not in engine(copy.deepcopy(qwen2), decode_graphs="off").stats()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_invalidated_cuda_capture_leaves_the_allocator_usable():
    """On a real device: a decode that synchronises mid-capture invalidates it, so ``capture_end`` fails before
    it ends the allocator's routing to the graph pool; after the eager fallback, ``empty_cache`` (what a sleep
    runs) must not hit the allocator's capture-underway assert, and another engine still captures."""

    def syncing(inputs, groups):
        if torch.cuda.is_current_stream_capturing():
            inputs.sum().item()
        return inputs[0, :, None].float().expand(-1, 5).clone()

    def plain(inputs, groups):
        return inputs[0, :, None].float().expand(-1, 5).clone()

    device = torch.device("cuda", torch.cuda.current_device())

    def make(decode):
        return StaticDecode(decode, num_slots=4, max_len=100, device=device, capture=True, fingerprint=tuple)

    broken = make(syncing)
    assert broken.run([7, 9], [3, 4], [3, 4])[:, 0].tolist() == [7, 9]
    assert broken.capture_error is not None and broken.stats()["decode_capture_failures_other"] == 1
    torch.cuda.empty_cache()
    healthy = make(plain)
    assert healthy.run([7, 9], [3, 4], [3, 4])[:, 0].tolist() == [7, 9]
    assert healthy.captures == 1 and healthy.capture_error is None
