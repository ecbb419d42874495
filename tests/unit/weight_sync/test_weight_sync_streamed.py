"""Streamed broadcast (``weight_sync.broadcast_apply: streamed``): each bucket is loaded into the built-in engine
as it arrives. Checked over a real gloo group on CPU, with one streamed and one staged engine in the same group:
the same weights bit for bit, one bucket held instead of the whole update (bytes counted while alive), a
mismatch or a partial update refused by name with the engine refusing to serve until a whole update lands,
and a sender lost mid-stream a named error."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from asyncrl.config.engine import EngineConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.runtime.ray_runtime import EngineActor
from asyncrl.trainer.distributed.process_group import free_port
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.protocol import WeightSyncError, WeightSyncTimeout
from asyncrl.weight_sync.receiver import expected_shapes, named_targets
from asyncrl.weight_sync.transports import update_of_buckets

BUCKET_BYTES = 64 * 2**10  # small, so the default tiny model travels as many buckets


def _groups(world_size: int, timeout_s: float = 60) -> list[WeightGroup]:
    port, groups = free_port("127.0.0.1"), [None] * world_size

    def join(rank: int) -> None:
        groups[rank] = WeightGroup(
            host="127.0.0.1", port=port, rank=rank, world_size=world_size, device="cpu", timeout_s=timeout_s
        )

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return groups


def _engines(groups: list[WeightGroup]) -> tuple[EngineActor, EngineActor]:
    """Rank 1 streamed, rank 2 staged, on the same seeded model."""
    actors = []
    for rank, apply in ((1, "streamed"), (2, "staged")):
        torch.manual_seed(0)
        actor = EngineActor(ModelConfig(device="cpu"), EngineConfig(), 1, broadcast_apply=apply)
        actor.weight_group = groups[rank]
        actors.append(actor)
    return actors[0], actors[1]


def _new_weights(actor: EngineActor, seed: int) -> list[tuple[str, torch.Tensor]]:
    """What a trainer would send: every name the engine expects (tied names alike), fresh values."""
    generator = torch.Generator().manual_seed(seed)
    targets = named_targets(actor.engine.core.model)
    fresh: dict[int, torch.Tensor] = {}
    for tensor in targets.values():
        fresh.setdefault(id(tensor), torch.randn(tensor.shape, generator=generator).to(tensor.dtype))
    return [(name, fresh[id(targets[name])]) for name in sorted(expected_shapes(actor.engine.core.model))]


def _buckets(named: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    buckets, current, size = [], [], 0
    for name, tensor in named:
        if current and size + tensor.nbytes > BUCKET_BYTES:
            buckets.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += tensor.nbytes
    return [*buckets, current]


def _publish(groups, actors, buckets, version: int):
    """Rank 0 sends on a thread while both engines receive on this loop; the sent buckets and the engines'
    outcomes (a version, or the exception)."""
    sent = {}

    def send() -> None:
        sent["flats"] = groups[0].send_packed(buckets, version)

    async def receive():
        return await asyncio.gather(*(a.stage_weights() for a in actors), return_exceptions=True)

    sender = threading.Thread(target=send)
    sender.start()
    outcomes = asyncio.run(receive())
    sender.join(60)
    return sent.get("flats"), outcomes


def _record_applied(group: WeightGroup) -> list[tuple[type, torch.device]]:
    """Each bucket's buffers' (type, device) as ``group.receive_streamed`` hands them to the engine."""
    applied: list[tuple[type, torch.device]] = []
    receive = group.receive_streamed

    def receive_streamed(apply):
        def recorded(flat):
            applied.extend((type(buffer), buffer.device) for buffer in flat.buffers.values())
            apply(flat)

        return receive(recorded)

    group.receive_streamed = receive_streamed
    return applied


def _state(actor: EngineActor) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in actor.engine.core.model.state_dict().items()}


def _shutdown(*actors: EngineActor) -> None:
    for actor in actors:
        actor.engine.shutdown()


def test_streamed_apply_equals_staged_bit_for_bit_and_holds_one_bucket():
    groups = _groups(3)
    streamed, staged = _engines(groups)
    try:
        before = _state(streamed)
        buckets = _buckets(_new_weights(streamed, seed=1))
        assert len(buckets) >= 4
        applied = _record_applied(groups[1])
        flats, outcomes = _publish(groups, [streamed, staged], buckets, version=1)
        assert outcomes == [1, 1]
        # streamed: applied from the torch buffers the group received into, where it received them
        assert len(applied) >= len(buckets) and set(applied) == {(torch.Tensor, groups[1].staging_device)}
        staged_buffers = [b for bucket in staged.staged[1] for b in bucket.buffers.values()]
        assert all(b.device == torch.device("cpu") and not b.is_pinned() for b in staged_buffers)  # host
        assert streamed.engine.version == 1 and staged.engine.version == 0  # streamed: landed on arrival
        update = update_of_buckets(flats, "broadcast", handle=None)
        for actor in (streamed, staged):
            asyncio.run(actor.update_weights(update, 1))
        assert staged.engine.version == 1
        want, got = _state(staged), _state(streamed)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[name], got[name]) for name in want)
        assert not any(torch.equal(want[name], before[name]) for name in want)  # the update changed them
        total = sum(t.nbytes for bucket in buckets for _, t in bucket)
        largest = max(sum(t.nbytes for _, t in bucket) for bucket in buckets)
        assert groups[1].held.peak <= 2 * largest < total  # counted while alive, not inferred
        assert groups[2].held.peak >= total - 2 * largest  # the staged path holds (about) the whole update
        assert groups[1].held.held == 0
        assert not streamed.engine.core.paused  # paused while receiving, as before after
    finally:
        _shutdown(streamed, staged)


def test_a_mismatch_mid_stream_is_refused_by_name_and_the_engine_serves_nothing_until_a_whole_update():
    groups = _groups(3)
    streamed, staged = _engines(groups)
    try:
        named = _new_weights(streamed, seed=2)
        buckets = _buckets(named)
        name, tensor = buckets[-1][0]
        buckets[-1][0] = (name, torch.zeros(tensor.numel() + 1))  # the last bucket does not fit the model
        flats, outcomes = _publish(groups, [streamed, staged], buckets, version=1)
        assert outcomes == [1, 1]  # the group stayed in step: both received the whole stream
        update = update_of_buckets(flats, "broadcast", handle=None)
        with pytest.raises(WeightSyncError, match=f"v1: .*{name}"):
            asyncio.run(streamed.update_weights(update, 1))
        with pytest.raises(WeightSyncError, match="half-applied update"):
            asyncio.run(streamed.generate(SimpleNamespace(request_id="r0")))
        with pytest.raises(WeightSyncError, match="half-applied update"):
            asyncio.run(streamed.resume())
        assert streamed.engine.core.paused and streamed.engine.version == 0
        with pytest.raises(WeightSyncError, match=name):  # the staged engine refuses it before copying
            asyncio.run(staged.update_weights(update, 1))

        whole = _buckets(_new_weights(streamed, seed=3))  # the next whole update heals it
        flats, outcomes = _publish(groups, [streamed, staged], whole, version=2)
        assert outcomes == [2, 2]
        asyncio.run(streamed.update_weights(update_of_buckets(flats, "broadcast", handle=None), 2))
        asyncio.run(staged.update_weights(update_of_buckets(flats, "broadcast", handle=None), 2))
        want, got = _state(staged), _state(streamed)
        assert all(torch.equal(want[name], got[name]) for name in want)
        assert not streamed.engine.core.paused and streamed.streamed.broken is None
    finally:
        _shutdown(streamed, staged)


def test_a_partial_update_is_refused_by_the_missing_names():
    groups = _groups(2)
    streamed, staged = _engines([*groups, None])
    staged.engine.shutdown()
    try:
        named = _new_weights(streamed, seed=4)
        dropped = named[-1][0]
        flats, outcomes = _publish(groups, [streamed], _buckets(named[:-1]), version=1)
        assert outcomes == [1]
        update = update_of_buckets(flats, "broadcast", handle=None)
        with pytest.raises(WeightSyncError, match=f"missing tensor.*{dropped}"):
            asyncio.run(streamed.update_weights(update, 1))
        with pytest.raises(WeightSyncError, match="half-applied"):
            asyncio.run(streamed.generate(SimpleNamespace(request_id="r0")))
    finally:
        streamed.engine.shutdown()


def test_a_sender_lost_mid_stream_is_a_named_error_and_the_engine_is_broken():
    groups = _groups(2, timeout_s=1.5)
    streamed, staged = _engines([*groups, None])
    staged.engine.shutdown()
    try:
        buckets = _buckets(_new_weights(streamed, seed=5))
        # the trainer stops after one bucket: no more bytes, no end marker
        sender = threading.Thread(target=_send_without_end, args=(groups[0], buckets[0]))
        sender.start()
        with pytest.raises(WeightSyncTimeout, match="weight group rank 1/2"):
            asyncio.run(streamed.stage_weights())
        sender.join(30)
        with pytest.raises(WeightSyncError, match="half-applied"):
            asyncio.run(streamed.generate(SimpleNamespace(request_id="r0")))
    finally:
        streamed.engine.shutdown()


def _send_without_end(group: WeightGroup, bucket: list[tuple[str, torch.Tensor]]) -> None:
    from asyncrl.weight_sync.broadcast import header_of, pack_on_device

    flat = pack_on_device(bucket, 1, group.staging_device)
    group._send_header(header_of(flat))
    for buffer in flat.buffers.values():
        group._broadcast(buffer)


@pytest.mark.parametrize(
    ("mode", "lora", "chosen"),
    [
        ("sync", False, "streamed"),
        ("partial_rollout", False, "streamed"),
        ("one_step_off", False, "staged"),
        ("async", False, "staged"),
        ("multi_version", False, "staged"),
        ("sync", True, "staged"),
        ("partial_rollout", True, "staged"),
    ],
)
def test_auto_streams_only_where_every_engine_updates_at_one_moment(mode, lora, chosen):
    assert WeightSyncConfig().broadcast_apply_for(mode, lora=lora) == chosen
    assert WeightSyncConfig(broadcast_apply="staged").broadcast_apply_for(mode, lora=lora) == "staged"
    if chosen == "staged":
        with pytest.raises(ValueError, match="weight_sync.broadcast_apply='streamed' cannot run with"):
            WeightSyncConfig(broadcast_apply="streamed").broadcast_apply_for(mode, lora=lora)


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
@pytest.mark.parametrize(
    ("overrides", "chosen"),
    [
        (["controller.mode=sync"], "streamed"),
        (["controller.mode=partial_rollout"], "streamed"),
        (["controller.mode=one_step_off", "buffer.async_ratio=1"], "staged"),
        (["controller.mode=async", "buffer.async_ratio=1"], "staged"),
        (["controller.mode=sync", "weight_sync.broadcast_apply=staged"], "staged"),
    ],
)
def test_a_run_decides_the_broadcast_apply_in_one_place_for_either_backend(backend, overrides, chosen):
    """``RunConfig.broadcast_apply`` is what the engine actor of either backend is given: vLLM streams where the
    built-in engine does (one decision, ``WeightSyncConfig.broadcast_apply_for``)."""
    config = load_run_config(
        None, ["runtime.type=local", "weight_sync.type=broadcast", f"engine.backend={backend}", *overrides]
    )
    assert config.broadcast_apply() == chosen


def test_a_run_config_refuses_streamed_where_engines_update_apart():
    with pytest.raises(ValueError, match="controller.mode='async' updates engines at different moments"):
        load_run_config(
            None,
            [
                "runtime.type=local",
                "weight_sync.type=broadcast",
                "weight_sync.broadcast_apply=streamed",
                "controller.mode=async",
            ],
        )
    with pytest.raises(ValueError, match="weight_sync.broadcast_apply must be one of"):
        WeightSyncConfig(broadcast_apply="eager")


def test_an_engine_paused_for_the_update_stays_paused_until_the_proxy_resumes_it():
    """partial_rollout: the proxy pauses every engine before the publish and resumes after model_update."""
    groups = _groups(2)
    streamed, staged = _engines([*groups, None])
    staged.engine.shutdown()
    try:
        asyncio.run(streamed.pause())
        flats, outcomes = _publish(groups, [streamed], _buckets(_new_weights(streamed, seed=6)), version=1)
        assert outcomes == [1] and streamed.engine.core.paused and streamed.engine.version == 1
        asyncio.run(streamed.update_weights(update_of_buckets(flats, "broadcast", handle=None), 1))
        asyncio.run(streamed.resume())
        assert not streamed.engine.core.paused
    finally:
        streamed.engine.shutdown()


def test_a_broken_engine_stays_paused_when_a_later_stream_fails_before_copying():
    """A stream that breaks the engine (mixed weights), then one refused at its first bucket (nothing copied):
    the engine still holds mixed weights, so it must stay paused, not generate for requests already inside."""
    groups = _groups(2)
    streamed, staged = _engines([*groups, None])
    staged.engine.shutdown()
    try:
        core = streamed.engine.core
        breaking = _buckets(_new_weights(streamed, seed=7))
        name, tensor = breaking[-1][0]
        breaking[-1][0] = (name, torch.zeros(tensor.numel() + 1))  # fails after earlier buckets were copied
        assert _publish(groups, [streamed], breaking, version=1)[1] == [1]
        assert streamed.streamed.broken is not None and core.paused
        refused = _buckets(_new_weights(streamed, seed=8))
        name, tensor = refused[0][0]
        refused[0][0] = (name, torch.zeros(tensor.numel() + 1))  # fails before anything is copied
        assert _publish(groups, [streamed], refused, version=2)[1] == [2]
        assert streamed.streamed.broken is not None
        assert core.paused  # still holding mixed weights: nothing may run on them
    finally:
        streamed.engine.shutdown()


def test_overlapping_streams_resume_the_engine_once_the_last_one_ends():
    """A publish retried over a re-formed group while the old group's stream is still in flight: the engine
    was running before either, so it runs again once both ended, and stays paused while either is in flight
    (no bucket of the later stream lands on a running engine)."""
    old, new = _groups(2), _groups(2)
    streamed, staged = _engines([None, None, None])  # each stream names its group
    staged.engine.shutdown()
    try:
        core = streamed.engine.core

        async def scenario() -> tuple[int, int, bool]:
            first = asyncio.create_task(streamed.streamed.receive(old[1]))
            await _until(lambda: core.paused, "the first stream pausing the engine")
            second = asyncio.create_task(streamed.streamed.receive(new[1]))
            await _until(lambda: streamed.streamed._streams == 2, "the second stream starting")
            await asyncio.to_thread(old[0].send_packed, _buckets(_new_weights(streamed, seed=9)), 1)
            first_version = await first
            paused_between = core.paused  # the second stream is still in flight
            await asyncio.to_thread(new[0].send_packed, _buckets(_new_weights(streamed, seed=9)), 1)
            return first_version, await second, paused_between

        assert asyncio.run(scenario()) == (1, 1, True)
        assert streamed.engine.version == 1 and streamed.streamed.broken is None
        assert not core.paused
    finally:
        streamed.engine.shutdown()


async def _until(condition, what: str, deadline_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s:g} s")
        await asyncio.sleep(0.01)


def test_an_engine_that_does_not_load_a_bucket_in_time_is_a_named_timeout_and_broken():
    """Loading a bucket is a wait like any other: an engine whose step thread is wedged fails the update within
    the group's deadline, and is broken (the copy may still land), while the stream is drained to its end."""
    groups = _groups(2)
    groups[1].timeout = timedelta(seconds=3)  # the engine's deadline; the sender keeps its own
    streamed, staged = _engines([*groups, None])
    staged.engine.shutdown()
    try:

        async def wedged(named) -> None:
            await asyncio.Event().wait()

        streamed.engine.apply_bucket = wedged
        flats, outcomes = _publish(groups, [streamed], _buckets(_new_weights(streamed, seed=10)), version=1)
        assert outcomes == [1] and flats is not None  # the whole stream was received: the sender finished
        update = update_of_buckets(flats, "broadcast", handle=None)
        with pytest.raises(WeightSyncError, match="v1: the engine did not load a bucket within 3 s"):
            asyncio.run(streamed.update_weights(update, 1))
        with pytest.raises(WeightSyncError, match="half-applied"):
            asyncio.run(streamed.generate(SimpleNamespace(request_id="r0")))
    finally:
        streamed.engine.shutdown()


def test_a_stream_cancelled_while_its_buckets_arrive_leaves_the_engine_paused_and_broken():
    """The driver cancels ``stage_weights`` past its deadline (``get_actor``), but the receiving thread goes
    on and may still copy buckets: the engine must not run again on those weights until a whole update."""
    groups = _groups(2)
    streamed, staged = _engines([*groups, None])
    staged.engine.shutdown()
    try:
        core = streamed.engine.core
        loading, release = threading.Event(), threading.Event()
        apply_bucket = streamed.engine.apply_bucket

        async def slow(named) -> None:
            loading.set()
            await asyncio.to_thread(release.wait, 30)
            await apply_bucket(named)

        streamed.engine.apply_bucket = slow
        sender = threading.Thread(
            target=groups[0].send_packed, args=(_buckets(_new_weights(streamed, seed=11)), 1)
        )
        sender.start()

        async def scenario() -> None:
            receiving = asyncio.create_task(streamed.stage_weights())
            await asyncio.to_thread(loading.wait, 30)
            receiving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await receiving
            release.set()
            await asyncio.to_thread(sender.join, 60)  # the rest of the stream lands after the cancel

        asyncio.run(scenario())
        assert not sender.is_alive()
        assert core.paused and streamed.streamed.broken is not None
        with pytest.raises(WeightSyncError, match="half-applied"):
            asyncio.run(streamed.resume())
    finally:
        streamed.engine.shutdown()


def test_a_superseded_stream_that_succeeds_after_a_newer_one_broke_the_engine_leaves_it_broken():
    """The old group's stream is held at its first bucket while the retry's stream (a newer one) breaks the
    engine part-way; the old stream then lands whole. Its buckets and the retry's are interleaved in the model,
    so the break must stay (engine paused, serving refused) until a whole newer update lands. The order is
    driven by events: no sleeps."""
    old, new = _groups(2), _groups(2)
    streamed, staged = _engines([None, None, None])  # each stream names its group
    staged.engine.shutdown()
    try:
        core = streamed.engine.core
        apply_bucket = streamed.engine.apply_bucket
        holding, release = threading.Event(), threading.Event()
        calls = []

        async def first_held(named) -> None:
            calls.append(len(calls))
            if len(calls) == 1:  # the old stream's first bucket: the retry's stream runs meanwhile
                holding.set()
                await asyncio.to_thread(release.wait, 60)
            await apply_bucket(named)

        streamed.engine.apply_bucket = first_held
        breaking = _buckets(_new_weights(streamed, seed=13))
        name, tensor = breaking[-1][0]
        breaking[-1][0] = (name, torch.zeros(tensor.numel() + 1))  # fails after earlier buckets were copied
        senders = [
            threading.Thread(target=old[0].send_packed, args=(_buckets(_new_weights(streamed, seed=12)), 1)),
            threading.Thread(target=new[0].send_packed, args=(breaking, 1)),
        ]

        async def scenario() -> tuple[int, int, bool]:
            senders[0].start()
            first = asyncio.create_task(streamed.streamed.receive(old[1]))
            await asyncio.to_thread(holding.wait, 60)
            senders[1].start()
            second_version = await streamed.streamed.receive(new[1])  # the retry breaks the engine
            broken_between = streamed.streamed.broken is not None
            release.set()
            return await first, second_version, broken_between

        assert asyncio.run(scenario()) == (1, 1, True)
        for sender in senders:
            sender.join(60)
        assert streamed.streamed.broken is not None  # the older stream's success does not clear it
        assert core.paused
        with pytest.raises(WeightSyncError, match="half-applied"):
            asyncio.run(streamed.generate(SimpleNamespace(request_id="r0")))
        streamed.weight_group = new[1]
        assert _publish(new, [streamed], _buckets(_new_weights(streamed, seed=14)), version=2)[1] == [2]
        assert (
            streamed.streamed.broken is None and not core.paused
        )  # a whole newer update lands: serving again
    finally:
        streamed.engine.shutdown()
