"""A trainer checkpoint's deadline scales with its bytes, the driver waits that deadline (not
``runtime.control_timeout_s``), a rank past it is ``TrainerDied``, and the ranks' process group is created
with a timeout at least as long (issue 45's review: Qwen3-8B on 8 NCCL ranks died at its first checkpoint).

The ranks are fakes whose calls take a stated number of seconds on an injected clock: ``ray.get`` answers at
once when every call is within its timeout and raises Ray's ``GetTimeoutError`` otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ray.exceptions import GetTimeoutError

from asyncrl.app import train as training
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.runtime import actor_calls, rank_calls
from asyncrl.runtime import trainer_group as tg
from asyncrl.runtime.errors import TrainerDied
from asyncrl.trainer.checkpoint import STATE_FILE, write_marker
from asyncrl.trainer.distributed import process_group

QWEN3_8B_BYTES = 114_700_000_000
"""A sharded Qwen3-8B checkpoint with fp32 masters: weights and two moments (98 GB) + a bf16 export (16.4 GB)."""


@dataclass(eq=False)  # each its own, hashable, as Ray's refs
class FakeRef:
    seconds: float
    value: Any


class FakeCall:
    def __init__(self, seconds: float, value: Any) -> None:
        self.seconds, self.value = seconds, value
        self.args: list[tuple] = []
        """The arguments of every call, in order."""

    def remote(self, *args: Any, **kwargs: Any) -> FakeRef:
        self.args.append(args)
        return FakeRef(self.seconds, self.value)


class FakeRank:
    """A rank whose checkpoint calls take ``seconds`` on the injected clock."""

    def __init__(self, seconds: float) -> None:
        self.save_checkpoint = FakeCall(seconds, "/ckpt/step_00000001")
        self.load_checkpoint = FakeCall(seconds, {"data": 1})
        self.progress = FakeCall(0.0, {"step": 1, "version": 1})


class FakeRay:
    """``ray.get`` and ``ray.wait`` on the injected clock; records every timeout they were given (a ``get`` of a
    ref ``wait`` found ready is answered at once and not recorded)."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []
        self.ready: set[int] = set()

    def get(self, ref: FakeRef | list[FakeRef], timeout: float) -> Any:
        refs = ref if isinstance(ref, list) else [ref]
        if not all(id(r) in self.ready for r in refs):
            self.timeouts.append(timeout)
            if max(r.seconds for r in refs) > timeout:
                raise GetTimeoutError("fake clock: past the timeout")
        values = [r.value for r in refs]
        return values if isinstance(ref, list) else values[0]

    def wait(self, refs: list[FakeRef], num_returns: int, timeout: float) -> tuple[list, list]:
        self.timeouts.append(timeout)
        ready = [r for r in refs if r.seconds <= timeout][:num_returns]
        self.ready.update(id(r) for r in ready)
        return ready, [r for r in refs if r not in ready]

    def cancel(self, ref: FakeRef) -> None:
        pass

    def kill(self, handle: Any, no_restart: bool) -> None:
        pass


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    fake = FakeRay()
    monkeypatch.setattr(actor_calls, "ray", fake)
    monkeypatch.setattr(rank_calls, "ray", fake)
    return fake


def client(seconds: float, checkpoint_bytes: int, num_ranks: int = 2) -> tg.TrainerGroupClient:
    runtime = RuntimeConfig(type="local")
    progress = [{"step": 1, "version": 1, "checkpoint_bytes": checkpoint_bytes}] * num_ranks
    return tg.TrainerGroupClient(
        [FakeRank(seconds) for _ in range(num_ranks)], runtime, progress, WeightSyncConfig()
    )


def test_the_deadline_is_the_floor_plus_the_bytes_at_the_conservative_bandwidth() -> None:
    runtime = RuntimeConfig(checkpoint_timeout_floor_s=100.0, checkpoint_timeout_gbps=0.5)
    assert runtime.checkpoint_timeout_s(0) == 100.0
    assert runtime.checkpoint_timeout_s(10**9) == 102.0
    sizes = [0, 10**6, 10**9, QWEN3_8B_BYTES]
    deadlines = [RuntimeConfig().checkpoint_timeout_s(n) for n in sizes]
    assert deadlines == sorted(set(deadlines))  # strictly growing with the bytes
    assert deadlines[-1] > 4 * RuntimeConfig().control_timeout_s
    proxy = ProxyConfig(update_timeout_floor_s=100.0, update_timeout_gbps=0.5)
    assert proxy.update_timeout_s(10**9) == 102.0  # the weight update's rule, shared


@pytest.mark.parametrize("name", ["checkpoint_timeout_floor_s", "checkpoint_timeout_gbps"])
def test_a_nonpositive_deadline_setting_is_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"runtime.{name} must be > 0"):
        RuntimeConfig(**{name: 0.0})


def test_a_large_checkpoint_is_waited_for_past_the_control_timeout(fake_ray: FakeRay) -> None:
    group = client(seconds=300.0, checkpoint_bytes=QWEN3_8B_BYTES)  # 115 GB written and hashed in 300 s
    deadline = RuntimeConfig().checkpoint_timeout_s(QWEN3_8B_BYTES)
    assert str(group.save_checkpoint("/ckpt")) == "/ckpt/step_00000001"
    assert fake_ray.timeouts[0] == pytest.approx(
        deadline, abs=1.0
    )  # each rank waited for within what is left of it
    assert all(timeout <= deadline for timeout in fake_ray.timeouts)
    del fake_ray.timeouts[:]
    assert group.load_checkpoint("/ckpt/step_00000001") == {"data": 1}
    assert fake_ray.timeouts[0] == pytest.approx(deadline, abs=1.0)
    assert group.config.control_timeout_s < 300.0  # the call the old deadline cut off


def test_only_rank_0_is_sent_the_checkpoints_extra(fake_ray: FakeRay) -> None:
    """``extra`` holds every buffered group (hundreds of MB at real shapes), and only rank 0 writes it: sent
    to every rank, it was serialized once per rank."""
    group = client(seconds=1.0, checkpoint_bytes=10**9, num_ranks=3)
    extra = {"buffered_groups": [1, 2, 3]}
    group.save_checkpoint("/ckpt", extra=extra, keep_last=2)
    assert [rank.save_checkpoint.args for rank in group.handles] == [
        [("/ckpt", extra, 2)],
        [("/ckpt", None, 2)],
        [("/ckpt", None, 2)],
    ]


@pytest.mark.parametrize("call", ["save", "load"])
def test_a_checkpoint_past_its_deadline_is_the_trainer_lost_by_name(fake_ray: FakeRay, call: str) -> None:
    """A rank that truly hangs still fails, as ``TrainerDied``: ``app.train`` restarts the run from its last
    verified checkpoint (``runtime.trainer_restarts``), a resume's load included."""
    group = client(seconds=float("inf"), checkpoint_bytes=10**9)
    with pytest.raises(
        TrainerDied, match=f"trainer: {call}_checkpoint: the trainer is lost .*no answer within"
    ):
        group.save_checkpoint("/ckpt") if call == "save" else group.load_checkpoint("/ckpt/step_00000001")


def test_the_process_group_waits_at_least_a_checkpoint_or_a_broadcast() -> None:
    config = load_run_config(None, ["runtime.type=local", "trainer.num_workers=2"])
    checkpoint_s = config.runtime.checkpoint_timeout_s(QWEN3_8B_BYTES)
    assert tg.collective_timeout_s(config, 300.0, QWEN3_8B_BYTES) == checkpoint_s
    small = tg.collective_timeout_s(config, 300.0, 0)
    assert small == max(300.0, config.weight_sync.timeout_s, config.runtime.checkpoint_timeout_floor_s)
    assert tg.collective_timeout_s(config, 10_000.0, QWEN3_8B_BYTES) == 10_000.0


class Joined(Exception):
    """Stops ``start`` once it has joined: the test is about what it joined with."""


def test_a_rank_creates_its_gloo_group_with_the_checkpoint_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TrainerRankActor.start`` sizes a checkpoint from the model's skeleton, then creates its process group
    (gloo on CPU) with ``collective_timeout_s``, not the rendezvous' ``startup_timeout_s``."""
    created: list[dict[str, Any]] = []

    def init_process_group(backend: str, **kwargs: Any) -> None:
        created.append({"backend": backend, **kwargs})
        raise Joined

    monkeypatch.setattr(process_group.dist, "init_process_group", init_process_group)
    config = load_run_config(
        None, ["runtime.type=local", "trainer.num_workers=2", "runtime.checkpoint_timeout_gbps=1e-5"]
    )
    rank = tg.TrainerRankActor(config, rank=1, world_size=2, num_threads=torch.get_num_threads())
    with pytest.raises(Joined):
        rank.start("127.0.0.1", 29500, timeout_s=300.0)
    assert rank.checkpoint_bytes > 0
    expected = tg.collective_timeout_s(config, 300.0, rank.checkpoint_bytes)
    assert expected == config.runtime.checkpoint_timeout_s(rank.checkpoint_bytes) > 300.0
    assert [(c["backend"], c["timeout"]) for c in created] == [("gloo", timedelta(seconds=expected))]


def test_a_resume_whose_load_passes_its_deadline_restarts_the_run_then_fails_by_name(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``app.train`` treats a resume's load past its deadline as a lost trainer: it restarts the run from the
    newest verified checkpoint, and once ``runtime.trainer_restarts`` are spent fails with ``TrainerDied`` naming
    the load (before, the load raised ``ActorCallTimeout``, which the restart loop let through)."""
    out = tmp_path / "run"
    step = out / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    (step / STATE_FILE).write_bytes(b"a verified checkpoint the fake ranks never read")
    write_marker(step)
    overrides = [
        "runtime.type=local",
        "trainer.num_workers=2",
        "runtime.trainer_restarts=1",
        "engine.max_model_len=64",
    ]
    config = load_run_config(None, [*overrides, f"output_dir={out}", f"resume={out}"])
    built: list[Any] = []

    @contextlib.contextmanager
    def parts_whose_load_hangs(run_config: Any) -> Iterator[Any]:
        parts = SimpleNamespace(config=run_config, trainer=client(float("inf"), 10**9), locations=dict)
        built.append(parts)
        yield parts

    monkeypatch.setattr(training, "runtime_parts", parts_whose_load_hangs)
    console = io.StringIO()
    with pytest.raises(TrainerDied, match="trainer: load_checkpoint: the trainer is lost"):
        asyncio.run(training.train(config, console=console))
    assert len(built) == 2  # the first try and one restart
    assert f"restart 1 from {step}" in console.getvalue()
