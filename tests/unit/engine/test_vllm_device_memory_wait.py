"""A vLLM engine starts only once its devices have the memory vLLM demands at start, within its start deadline.

vLLM looks once and refuses to start when a device's free memory is below ``gpu_memory_utilization`` × its
total; a replacement engine starts on its predecessor's GPUs while that engine's processes may still be exiting.
The worker waits for the memory (``worker_main.wait_for_device_memory``), here against a scripted device and a
fake clock (no time passes); the devices it reads are the engine's, mapped through ``CUDA_VISIBLE_DEVICES`` to
NVML's numbering, and no usable NVML means no wait (a fake NVML); then end to end through the real ``VLLMEngineClient.start`` and the real worker,
with a stand-in ``vllm`` whose platform is CUDA and whose NVML reports a device that never frees: the start
fails with the worker's named error before the client's own deadline, not as an anonymous timeout. No GPU here.
"""

from __future__ import annotations

import math
import sys
import types

import pytest

from asyncrl.config.engine import VLLMConfig
from asyncrl.engine.vllm import worker_main
from asyncrl.engine.vllm.client import VLLMEngineClient, VLLMWorkerError
from tests.unit.engine.test_vllm_startup_deadline import FAILING_ENGINE, fake_vllm_python

GIB = 2**30
TOTAL = 80 * GIB
UTILIZATION = 0.85
NEEDED = math.ceil(TOTAL * UTILIZATION)  # vLLM's demand, computed as vLLM computes it


class ScriptedDevices:
    """Each device reports ``busy_free`` bytes free for its first ``busy_polls`` looks, then ``TOTAL`` free;
    a fake clock that moves only when the wait sleeps."""

    def __init__(self, busy_polls: dict[int, int], busy_free: int = 10 * GIB) -> None:
        self.busy_polls = busy_polls
        self.busy_free = busy_free
        self.looks: dict[int, int] = dict.fromkeys(busy_polls, 0)
        self.now = 100.0
        self.slept: list[float] = []

    def probe(self, device: int) -> tuple[int, int]:
        self.looks[device] += 1
        busy = self.looks[device] <= self.busy_polls[device]
        return (self.busy_free if busy else TOTAL), TOTAL

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, "the wait slept for nothing: it would spin"
        self.slept.append(seconds)
        self.now += seconds


def wait(devices: ScriptedDevices, deadline: float) -> None:
    worker_main.wait_for_device_memory(
        list(devices.busy_polls),
        UTILIZATION,
        deadline,
        devices.probe,
        clock=devices.clock,
        sleep=devices.sleep,
        poll_s=0.5,
    )


def test_the_start_proceeds_once_every_device_has_freed_the_memory():
    devices = ScriptedDevices({0: 3, 1: 5})  # device 1 frees two looks after device 0
    wait(devices, deadline=devices.now + 60)
    assert devices.looks == {0: 6, 1: 6}  # five short rounds, then one where both have it
    assert devices.slept == [0.5] * 5


def test_memory_already_free_costs_one_look_and_no_sleep():
    devices = ScriptedDevices({0: 0})
    wait(devices, deadline=devices.now)  # a deadline already due: one look is still taken
    assert (devices.looks, devices.slept) == ({0: 1}, [])


def test_exactly_the_demand_is_enough_and_one_byte_less_is_not():
    def probe_with(free: int):
        return lambda device: (free, TOTAL)

    worker_main.wait_for_device_memory([0], UTILIZATION, 0.0, probe_with(NEEDED), clock=lambda: 1.0)
    with pytest.raises(worker_main.DeviceMemoryBusy):
        worker_main.wait_for_device_memory([0], UTILIZATION, 0.0, probe_with(NEEDED - 1), clock=lambda: 1.0)


def test_a_device_that_never_frees_fails_the_start_by_name_at_the_deadline():
    devices = ScriptedDevices({0: 0, 1: 10**9}, busy_free=10 * GIB)
    with pytest.raises(worker_main.DeviceMemoryBusy) as error:
        wait(devices, deadline=devices.now + 3.2)
    message = str(error.value)
    assert f"cuda:1 has {10 * GIB} bytes free" in message and f"needs {NEEDED}" in message
    assert "cuda:0" not in message  # only the short device is named
    assert "engine.vllm.startup_timeout_s" in message and "engine.vllm.gpu_memory_utilization" in message
    assert devices.now == pytest.approx(103.2)  # it slept up to the deadline, never past it
    assert devices.slept[-1] == pytest.approx(0.2)


class FakeNVML(types.ModuleType):
    """NVML's bindings as ``nvml_memory`` calls them: physical devices by index and by UUID, each with its
    own free memory; ``fail_init`` as on a machine without a usable NVML."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: dict[int, str], fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.fail_init = fail_init
        self.open = False

    def nvmlInit(self) -> None:  # noqa: N802 (NVML's names)
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.open = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.open = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index not in self.devices:
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        for index, known in self.devices.items():
            if known == uuid:
                return index
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        assert self.open, "NVML read outside nvmlInit / nvmlShutdown"
        return types.SimpleNamespace(free=handle * GIB, total=TOTAL)


@pytest.fixture
def nvml(monkeypatch):
    """Install a ``FakeNVML`` as ``vllm.third_party.pynvml``, where the worker imports it from."""

    def install(devices: dict[int, str], fail_init: bool = False) -> FakeNVML:
        fake = FakeNVML(devices, fail_init)
        third_party = types.ModuleType("vllm.third_party")
        third_party.pynvml = fake
        monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
        monkeypatch.setitem(sys.modules, "vllm.third_party", third_party)
        monkeypatch.setitem(sys.modules, "vllm.third_party.pynvml", fake)
        return fake

    return install


def test_visible_devices_map_to_nvml_by_index_or_uuid_and_only_the_engines_are_read(nvml, monkeypatch):
    fake = nvml({3: "GPU-aaa", 5: "GPU-bbb", 7: "GPU-ccc"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, GPU-ccc,3")
    with worker_main.nvml_memory(2) as devices:
        probe, ordinals = devices
        assert ordinals == [0, 1]  # tensor × pipeline parallel = 2 of the 3 visible
        assert [probe(o) for o in ordinals] == [(5 * GIB, TOTAL), (7 * GIB, TOTAL)]
    assert not fake.open


def test_without_cuda_visible_devices_nvml_numbers_them(nvml, monkeypatch):
    nvml({0: "GPU-aaa", 1: "GPU-bbb"})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with worker_main.nvml_memory(4) as devices:
        probe, ordinals = devices
        assert (ordinals, probe(1)) == ([0, 1], (GIB, TOTAL))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # set but empty: CUDA sees none, so none to wait for
    with worker_main.nvml_memory(4) as devices:
        assert devices[1] == []


@pytest.mark.parametrize("case", ["no library", "unknown uuid"])
def test_no_usable_nvml_means_no_wait_said_on_stderr(nvml, monkeypatch, capsys, case):
    fake = nvml({3: "GPU-aaa"}, fail_init=case == "no library")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-zzz")
    with worker_main.nvml_memory(1) as devices:
        assert devices is None
    assert "not waiting for device memory" in capsys.readouterr().err
    assert not fake.open


FAKE_CUDA_PLATFORMS = """
class _Platform:
    def is_cpu(self):
        return False

    def is_cuda(self):
        return True

current_platform = _Platform()
"""

FAKE_NVML = f"""
import os

class NVMLError(Exception):
    pass

class _Memory:
    free = {10 * GIB}
    total = {TOTAL}

looks = 0

def nvmlInit():
    pass

def nvmlShutdown():
    pass

def nvmlDeviceGetCount():
    return 1

def nvmlDeviceGetHandleByIndex(index):
    assert index == int(os.environ["CUDA_VISIBLE_DEVICES"]), index
    return index

def nvmlDeviceGetMemoryInfo(handle):
    global looks
    looks += 1
    memory = _Memory()
    if looks > int(os.environ.get("ASYNCRL_TEST_BUSY_LOOKS", "1000000000")):
        memory.free = memory.total
    return memory
"""
"""NVML as the worker reads it: physical device ``CUDA_VISIBLE_DEVICES`` has 10 GiB of 80 free for its first
``ASYNCRL_TEST_BUSY_LOOKS`` looks (unset: for ever), then all of it."""


def cuda_vllm_python(root):
    """A stand-in vLLM environment on a CUDA platform whose engine build fails at once, saying it was reached."""
    python = fake_vllm_python(root, FAILING_ENGINE, platforms=FAKE_CUDA_PLATFORMS)
    third_party = root / "fake" / "vllm" / "third_party"
    third_party.mkdir()
    (third_party / "__init__.py").write_text("")
    (third_party / "pynvml.py").write_text(FAKE_NVML)
    return python


@pytest.mark.skipif(sys.platform != "linux", reason="the worker's session kill is POSIX's")
def test_a_device_that_never_frees_fails_the_worker_start_with_its_named_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    config = VLLMConfig(
        python=str(cuda_vllm_python(tmp_path)), startup_timeout_s=6.0, gpu_memory_utilization=0.85
    )
    with pytest.raises(VLLMWorkerError, match="while starting its engine") as error:
        VLLMEngineClient.start(tmp_path / "model", config, max_model_len=64)
    message = str(error.value)
    assert "DeviceMemoryBusy" in message and f"cuda:0 has {10 * GIB} bytes free" in message
    assert "not enough device memory for the model" not in message  # vLLM's engine build was never reached


@pytest.mark.skipif(sys.platform != "linux", reason="the worker's session kill is POSIX's")
def test_a_device_that_frees_lets_the_worker_go_on_to_build_its_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("ASYNCRL_TEST_BUSY_LOOKS", "2")
    config = VLLMConfig(
        python=str(cuda_vllm_python(tmp_path)), startup_timeout_s=60.0, gpu_memory_utilization=0.85
    )
    with pytest.raises(VLLMWorkerError, match="while starting its engine") as error:
        VLLMEngineClient.start(tmp_path / "model", config, max_model_len=64)
    message = str(error.value)
    assert "not enough device memory for the model" in message  # the stand-in's build, reached after the wait
    assert "waiting for device memory: cuda:0" in message and "DeviceMemoryBusy" not in message
