"""The engine's own CUDA stream, on CPU: with class-based fake streams (``torch.cuda.stream`` monkeypatched),
every hand-off of device memory between the engine thread and the others is ordered by ``EngineStream``'s
rule: the engine stream drained and waiting on the producers' (default) stream before the engine uses what was
handed over, and drained again before the caller hears back. The real streams run in the CUDA twin
(``test_engine_streams_cuda.py``)."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from engine_testlib import engine, request
from test_engine_adapters import adapted
from test_engine_adapters import publish as publish_adapter

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.engine.streams import EngineStream
from asyncrl.testing.pause_at import PauseAt
from asyncrl.weight_sync import InProcessSync
from asyncrl.weight_sync.colocated import ColocatedSync
from asyncrl.weight_sync.delta import DeltaSync

TIMEOUT = 30
WATCHED = ("update_weights", "apply_bucket", "sleep", "wake", "export_request", "import_request", "step")


class Recorder:
    """What the fakes and the watched engine methods did, in order, each with the stream current on the thread
    that did it (per thread, as PyTorch's current stream is)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def current(self) -> str:
        return getattr(self._local, "stream", "default")

    def set_current(self, name: str) -> None:
        self._local.stream = name

    def add(self, entry: str) -> None:
        with self._lock:
            self.log.append(entry)


class FakeStream:
    def __init__(self, name: str, recorder: Recorder) -> None:
        self.name, self.recorder = name, recorder

    def wait_stream(self, other: FakeStream) -> None:
        self.recorder.add(f"{self.name} waits {other.name}")

    def synchronize(self) -> None:
        self.recorder.add(f"{self.name} drained")


class FakeStreamContext:
    """``torch.cuda.stream(s)``: ``s`` current on this thread until exit, the previous one after."""

    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.previous = ""

    def __enter__(self) -> None:
        self.previous = self.stream.recorder.current()
        self.stream.recorder.set_current(self.stream.name)
        self.stream.recorder.add(f"enter {self.stream.name}")

    def __exit__(self, *exc: object) -> bool:
        self.stream.recorder.set_current(self.previous)
        self.stream.recorder.add(f"exit {self.stream.name}")
        return False


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    """Fake streams in place of ``torch.cuda.stream``, and the engine methods that use handed-over memory
    logging which stream they ran on."""
    recorder = Recorder()
    monkeypatch.setattr(torch.cuda, "stream", FakeStreamContext)
    for name in WATCHED:
        original = getattr(LLMEngine, name)

        def watched(self, *args, _original=original, _name=name, **kwargs):
            if _name != "step" or self.has_work():
                recorder.add(f"{_name} on {recorder.current()}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LLMEngine, name, watched)
    return recorder


def served(model, recorder: Recorder, name: str = "engine", **config) -> AsyncEngine:
    default = FakeStream("default", recorder)
    return AsyncEngine(engine(model, **config), stream=EngineStream(FakeStream(name, recorder), default))


def on_trainer_thread(recorder: Recorder, fn):
    """``fn()`` on another thread (the trainer's, on the default stream), logged as the producer."""
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join(TIMEOUT)
    recorder.add(f"produced on {recorder.current()}")
    return box[0]


def ordered_handoff(log: list[str], use: str, stream: str = "engine") -> None:
    """The rule: drained, waiting on the producers, used on the engine's stream, drained again."""
    at = log.index(f"{use} on {stream}")
    assert log[at - 2 : at + 2] == [
        f"{stream} drained",
        f"{stream} waits default",
        f"{use} on {stream}",
        f"{stream} drained",
    ], log


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def test_the_helper_is_a_noop_on_cpu_and_with_the_default_stream(qwen2) -> None:
    assert EngineStream.for_device(torch.device("cpu"), "own").stream is None
    assert EngineStream.for_device(torch.device("cuda", 0), "default").stream is None
    noop = EngineStream()
    assert noop.handoff(lambda: 7) == 7 and noop.mode == "default"
    with noop.serving():
        pass
    cpu = AsyncEngine(engine(qwen2))
    try:
        assert cpu.stream.mode == "default"
    finally:
        cpu.shutdown()


def test_own_mode_on_cuda_makes_a_stream_and_bad_modes_are_refused_by_name(monkeypatch) -> None:
    made = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: made.append(device) or "own")
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device: "default")
    stream = EngineStream.for_device(torch.device("cuda", 0), "own")
    assert (stream.stream, stream.producer, stream.mode, made) == (
        "own",
        "default",
        "own",
        [torch.device("cuda", 0)],
    )
    with pytest.raises(ValueError, match="engine.cuda_stream"):
        EngineStream.for_device(torch.device("cuda", 0), "mine")
    with pytest.raises(ValueError, match="engine.cuda_stream"):
        EngineConfig(cuda_stream="mine")
    with pytest.raises(ValueError, match="both"):
        EngineStream("own", None)


def test_the_engine_thread_steps_on_its_own_stream_after_waiting_for_its_construction(
    qwen2, recorder
) -> None:
    async def scenario(served_engine: AsyncEngine):
        return await served_engine.generate(request("r", [5, 6, 7], max_new_tokens=4, ignore_eos=True))

    target = served(qwen2, recorder)
    try:
        assert len(run(scenario(target)).token_ids) == 4
    finally:
        target.shutdown()
    log = recorder.log
    assert log[:2] == ["engine waits default", "enter engine"] and log[-1] == "exit engine", log
    steps = [entry for entry in log if entry.startswith("step on")]
    assert steps and set(steps) == {"step on engine"}, log


def _weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor + 0.01 for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("transport", ["in_process", "colocated", "delta"])
def test_a_weight_update_is_used_on_the_engine_stream_only_after_the_producer(
    qwen2, recorder, transport, tmp_path
):
    syncs = {
        "in_process": InProcessSync,
        "colocated": lambda: ColocatedSync("cpu"),
        "delta": lambda: DeltaSync(tmp_path),
    }
    sync = syncs[transport]()
    update = on_trainer_thread(recorder, lambda: sync.publish(1, _weights(qwen2)))
    target = served(copy.deepcopy(qwen2), recorder)
    try:
        run(target.update_weights(update, 1))
        recorder.add("caller resumed")
        published = dict(_weights(qwen2))
        served_weights = target.core.model.state_dict()
        assert all(torch.equal(served_weights[name], value) for name, value in published.items())
    finally:
        target.shutdown()
    log = recorder.log
    ordered_handoff(log, "update_weights")
    assert log.index("produced on default") < log.index("update_weights on engine")
    assert log.index("update_weights on engine") + 2 == log.index("caller resumed"), log


def test_an_adapter_update_is_ordered_like_a_full_one(qwen2, recorder) -> None:
    update = on_trainer_thread(recorder, lambda: publish_adapter(adapted(qwen2, seed=1), 1))
    target = served(copy.deepcopy(qwen2), recorder)
    try:
        run(target.update_weights(update, 1))
        assert target.core.adapters.num_adapted > 0 and target.version == 1
    finally:
        target.shutdown()
    ordered_handoff(recorder.log, "update_weights")


def test_streamed_buckets_sleep_and_wake_are_ordered_hand_offs(qwen2, recorder) -> None:
    weights = _weights(qwen2)
    names = sorted(weights)
    buckets = [
        {n: weights[n] for n in names[: len(names) // 2]},
        {n: weights[n] for n in names[len(names) // 2 :]},
    ]

    async def scenario(target: AsyncEngine):
        for bucket in buckets:
            await target.apply_bucket(bucket)
        await target.finish_stream(1)
        freed = await target.sleep(1)
        allocated = await target.wake()
        return freed, allocated

    target = served(copy.deepcopy(qwen2), recorder)
    try:
        freed, allocated = run(scenario(target))
        assert freed > 0 and allocated == freed and target.version == 1
        assert all(torch.equal(target.core.model.state_dict()[n], w) for n, w in weights.items())
    finally:
        target.shutdown()
    log = recorder.log
    applies = [at for at, entry in enumerate(log) if entry == "apply_bucket on engine"]
    assert len(applies) == 2
    for at in applies:
        assert log[at - 2 : at + 2] == ["engine drained", "engine waits default", log[at], "engine drained"]
    ordered_handoff(log, "sleep")
    ordered_handoff(log, "wake")


def test_a_migrated_request_leaves_one_stream_drained_before_the_other_reads_it(qwen2, recorder) -> None:
    async def scenario(source: AsyncEngine, target: AsyncEngine):
        hold = PauseAt([source], "r", 3)  # paused mid-generation on its own thread, so the export finds it
        call = asyncio.ensure_future(
            source.generate(request("r", [5, 6, 7], max_new_tokens=50, ignore_eos=True))
        )
        await hold.reached()
        state = await source.export_request("r")
        await call
        return await target.import_request(state)

    source, target = served(qwen2, recorder, "engine A"), served(qwen2, recorder, "engine B")
    try:
        finished = run(scenario(source, target))
        assert len(finished.token_ids) == 50
    finally:
        source.shutdown()
        target.shutdown()
    log = recorder.log
    ordered_handoff(log, "export_request", "engine A")
    ordered_handoff(log, "import_request", "engine B")
    assert log.index("export_request on engine A") + 1 < log.index("import_request on engine B")


def test_a_refused_update_still_drains_the_stream_before_the_caller_hears(qwen2, recorder) -> None:
    target = served(copy.deepcopy(qwen2), recorder)
    try:
        with pytest.raises(ValueError, match="unknown tensor"):
            run(target.update_weights({"no.such.weight": torch.zeros(1)}, 1))
        recorder.add("caller heard")
    finally:
        target.shutdown()
    log = recorder.log
    ordered_handoff(log, "update_weights")
    assert log[log.index("update_weights on engine") + 2] == "caller heard", log
