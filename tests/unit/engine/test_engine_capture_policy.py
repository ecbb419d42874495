"""Which static decode shapes are captured (``engine.decode_graph_min_uses``): a shape runs eagerly until its
n-th step within a wake, is captured then and replayed after; the tokens are the same on both sides of that
transition; the counts of each wake reach the engine's stats; and the simulation that chose the default
(``asyncrl.sim.decode_captures``) plans exactly the shapes the engine runs."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from engine_testlib import drain, engine, request
from test_engine_static_decode import NUM_SLOTS, FakeCuda, _requests, _run, capturing_over

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.decode_plan import MIN_LENGTH_BUCKET
from asyncrl.engine.static_decode import StaticDecode
from asyncrl.sim.decode_captures import decode_shapes

ONE_ROW = (1, ((0, 1, MIN_LENGTH_BUCKET),))
TWO_ROWS = (2, ((0, 2, MIN_LENGTH_BUCKET),))


def recording_static(min_uses: int, addresses: list[tuple[int, ...]] | None = None):
    """A static decode over a fake decode and a fake capture, as on CUDA: the shapes it ran eagerly and the
    ones it captured, in order."""
    eager, captured = [], []

    def decode(inputs, groups):
        eager.append((inputs.shape[1], groups))
        return inputs[0, :, None].float().expand(-1, 5).clone()

    static = StaticDecode(
        decode,
        num_slots=4,
        max_len=100,
        device=torch.device("cpu"),
        capture=False,
        fingerprint=(lambda: addresses[0]) if addresses else tuple,
        min_uses=min_uses,
    )
    static.capture = True

    def capture(batch, groups):
        captured.append((batch, groups))
        static.logits = torch.zeros(4, 5)
        return types.SimpleNamespace(replay=lambda: None)

    static._capture = capture
    return static, eager, captured


def test_a_shape_runs_eagerly_until_its_nth_step_in_a_wake_then_is_captured(monkeypatch):
    FakeCuda().install(monkeypatch)  # the graph pool a release takes
    static, eager, captured = recording_static(min_uses=3)
    for _ in range(4):
        static.run([7], [3], [3])
    static.run([7, 9], [3, 4], [3, 4])
    assert eager == [ONE_ROW, ONE_ROW, TWO_ROWS] and captured == [ONE_ROW]
    assert (static.wake.eager_steps, static.wake.replays, static.wake.captures) == (3, 2, 1)
    assert static.wake.eager_shapes == {ONE_ROW, TWO_ROWS}
    assert static.stats()["decode_wake_graph_captures"] == 0  # no wake has ended yet

    static.release()  # a sleep: the graphs go, and the steps counted towards a capture
    assert static.stats()["decode_wake_graph_captures"] == 1
    assert static.stats()["decode_wake_eager_steps"] == 3 and static.wake.eager_steps == 0
    static.run([7], [3], [3])
    assert eager[-1] == ONE_ROW and captured == [ONE_ROW]  # its first step of this wake: eager again
    assert static.total.eager_steps == 4 and static.total.captures == 1


def test_min_uses_one_captures_every_shape_at_first_use():
    static, eager, captured = recording_static(min_uses=1)
    static.run([7], [3], [3])
    static.run([7, 9], [3, 4], [3, 4])
    assert eager == [] and captured == [ONE_ROW, TWO_ROWS]


def test_addresses_moving_within_a_wake_recapture_a_shape_past_its_count_at_once(monkeypatch):
    """The graphs depend on the addresses, the count of steps on the workload: a shape already captured is
    captured again at its next step, not after ``min_uses`` more."""
    FakeCuda().install(monkeypatch)  # the fresh graph pool the moved addresses take
    addresses = [(1,)]
    static, eager, captured = recording_static(min_uses=2, addresses=addresses)
    static.run([7], [3], [3])
    static.run([7], [3], [3])
    addresses[0] = (2,)
    static.run([7], [3], [3])
    assert eager == [ONE_ROW] and captured == [ONE_ROW, ONE_ROW]


def test_min_uses_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="engine.decode_graph_min_uses"):
        EngineConfig(decode_graph_min_uses=0)
    with pytest.raises(ValueError, match="decode_graph_min_uses"):
        StaticDecode(
            lambda inputs, groups: None,
            num_slots=2,
            max_len=64,
            device=torch.device("cpu"),
            capture=False,
            fingerprint=tuple,
            min_uses=0,
        )


def captured_engine(model, cuda: FakeCuda, min_uses: int):
    """An engine whose static decode captures over ``cuda``'s fakes, each graph replaying the runner's own
    decode over the static input buffer into the static logits, as a CUDA graph of it would."""
    core = engine(
        copy.deepcopy(model),
        decode_graphs="on",
        max_running_requests=NUM_SLOTS,
        max_kv_tokens=4096,
        max_prefill_tokens_per_step=64,
    )
    runner = core.runner
    decode = cuda.replaying(runner._decode_rows, lambda: runner.static)
    runner.static = capturing_over(
        cuda, decode, num_slots=NUM_SLOTS, max_len=runner.cache.max_len, min_uses=min_uses
    )
    return core


@pytest.mark.parametrize("min_uses", [1, 3])
def test_tokens_are_the_same_across_the_eager_to_captured_transition(qwen2, monkeypatch, min_uses):
    """Greedy and seeded requests crossing every batch bucket: shapes run eagerly, then captured and replayed
    from the static buffers, give the dynamic path's tokens."""
    cuda = FakeCuda(capture_end_fails=False)
    cuda.install(monkeypatch)
    dynamic, _ = _run(qwen2, "off")
    core = captured_engine(qwen2, cuda, min_uses)
    for req in _requests():
        core.add_request(req)
    captured = drain(core)
    static = core.runner.static
    assert static.total.captures > 0 and static.total.replays > 0
    assert (static.total.eager_steps > 0) == (min_uses > 1)
    assert static.total.eager_steps == sum(min(n, min_uses - 1) for n in static.uses.values())
    assert static.total.captures == sum(1 for n in static.uses.values() if n >= min_uses)
    assert captured.keys() == dynamic.keys()
    for rid, expected in dynamic.items():
        assert captured[rid].token_ids == expected.token_ids, rid
        assert captured[rid].logprobs == pytest.approx(expected.logprobs, abs=1e-4), rid


def test_an_engine_asleep_reports_the_captures_of_the_rollout_it_served(qwen2, monkeypatch):
    """What ``runtime.switch`` logs each step (``colocate/decode_*``): the engine's stats while it sleeps give
    the wake that ended, and a woken engine captures its shapes again."""
    cuda = FakeCuda(capture_end_fails=False)
    cuda.install(monkeypatch)
    core = captured_engine(qwen2, cuda, min_uses=2)
    served = []
    for _ in range(2):
        for req in _requests():
            core.add_request(req)
        drain(core)
        core.sleep(1)
        served.append({key: value for key, value in core.stats().items() if key.startswith("decode_wake_")})
        core.wake()
    first, second = served
    assert first["decode_wake_graph_captures"] > 0 and first["decode_wake_eager_steps"] > 0
    assert first["decode_wake_capture_s"] > 0
    assert {k: v for k, v in first.items() if k != "decode_wake_capture_s"} == {
        k: v for k, v in second.items() if k != "decode_wake_capture_s"
    }
    assert core.stats()["decode_graph_captures"] == 2 * first["decode_wake_graph_captures"]


def test_the_simulated_rollout_plans_the_shapes_the_engine_runs(qwen2):
    """``decode_captures.decode_shapes`` (the real scheduler over requests that carry only their lengths) gives
    every decode step's static shape as the engine ran it: more requests than slots, so rows are refilled
    while others decode, and chunked prefills leave idle rows in the decode batch."""
    prompts = [5 + 7 * i % 40 for i in range(11)]
    outputs = [3 + 11 * i % 50 for i in range(11)]
    core = engine(
        copy.deepcopy(qwen2),
        decode_graphs="on",
        max_running_requests=4,
        max_kv_tokens=4096,
        max_prefill_tokens_per_step=16,
    )
    ran = []
    run = core.runner.static.run

    def recording(token_ids, rope, writes, shape=None):
        ran.append(shape)
        return run(token_ids, rope, writes, shape)

    core.runner.static.run = recording
    for index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        tokens = [(3 * index + j) % 90 + 3 for j in range(prompt)]
        core.add_request(request(str(index), tokens, temperature=0, max_new_tokens=output, ignore_eos=True))
    drain(core)
    planned = decode_shapes(
        prompts,
        outputs,
        num_slots=4,
        max_model_len=core.max_model_len,
        max_kv_tokens=4096,
        max_prefill_tokens_per_step=16,
    )
    assert len(ran) > sum(outputs) / 4 and len({shape[0] for shape in ran}) >= 3
    assert planned == ran
