"""``asyncrl doctor``: the memory arithmetic with exact values, and each concern's verdict on machines the test
describes (no GPU here: a ``Machine`` stands in for one), through the CLI's exit status and lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import types
from pathlib import Path

import pytest
from transformers.utils import is_flash_attn_2_available

from asyncrl.app import doctor
from asyncrl.app.doctor import (
    Gpu,
    Machine,
    Status,
    check_attention_here,
    check_ray,
    check_shared_memory,
    check_vllm,
    diagnose,
    gpus_needed,
)
from asyncrl.app.memory_plan import kv_slots_that_fit
from asyncrl.cli import main as cli
from asyncrl.config.run import load_run_config
from asyncrl.engine.vllm import shm_room
from asyncrl.models.loading import DEFAULT_MODEL_DIR
from asyncrl.sim.model_shape import shape_from_hf_config
from asyncrl.testing.hub_cache import use_offline_cache

GIB = 2**30
QWEN3_8B = {
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
}
SMALL = ("task.num_train=50", "task.num_eval=10", "rollout.max_new_tokens=100")


def model_like(tmp_path: Path, hf_config: dict) -> str:
    """A model directory with ``hf_config``'s shape (no weights: doctor never loads them) and the tiny tokenizer."""
    directory = tmp_path / hf_config["model_type"]
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(DEFAULT_MODEL_DIR / name, directory / name)
    (directory / "config.json").write_text(json.dumps(hf_config))
    return str(directory)


def h100s(count: int) -> Machine:
    gpu = Gpu("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB)
    return Machine((gpu,) * count, 16, 120 * GIB, "2.11.0+cu130", "13.0")


def verdicts(findings) -> dict[str, Status]:
    """The worst status per topic."""
    order = [Status.OK, Status.WARN, Status.FAIL]
    worst: dict[str, Status] = {}
    for f in findings:
        worst[f.topic] = max(worst.get(f.topic, Status.OK), f.status, key=order.index)
    return worst


def test_kv_slots_that_fit_leave_the_weights_and_a_tenth_free() -> None:
    assert kv_slots_that_fit(10 * GIB, 2 * GIB, GIB) == 7 and kv_slots_that_fit(GIB, 2 * GIB, GIB) == 0


def test_an_8b_model_fits_on_separate_h100s_but_not_on_one_inline(tmp_path: Path) -> None:
    model = model_like(tmp_path, QWEN3_8B)
    common = (*SMALL, f"model.path={model}", "model.device=cuda", "model.dtype=bfloat16")
    inline = verdicts(diagnose(load_run_config(None, [*common, "trainer.num_workers=1"]), h100s(1)))
    assert inline["gpu memory"] is Status.FAIL  # bf16 weights, grads, 2 moments, activations + an engine
    spread = load_run_config(
        None,
        [
            *common,
            *(
                "runtime.type=local",
                "trainer.num_workers=2",
                "rollout.num_engines=2",
                "runtime.colocate=never",
            ),
            *("trainer.activation_checkpointing=true", "trainer.mixed_precision=bf16"),
        ],
    )
    assert verdicts(diagnose(spread, h100s(4)))["gpu memory"] is Status.OK
    short = verdicts(diagnose(spread, h100s(2)))
    assert short["gpus"] is Status.FAIL  # 2 ranks + 2 engines reserve 4 GPUs
    paired = load_run_config(
        None, [*common, "runtime.type=local", "trainer.num_workers=2", "rollout.num_engines=2"]
    )
    assert gpus_needed(paired) == 2  # sync colocated on Ray: rank i and engine i share bundle i, one GPU
    greedy = load_run_config(None, [*common, "engine.max_running_requests=512", "engine.max_model_len=32768"])
    findings = diagnose(greedy, h100s(1))
    failed = {
        f.detail.split(":")[0]: f for f in findings if f.topic == "gpu memory" and f.status is Status.FAIL
    }
    memory = failed["the one GPU (trainer + engines, inline)"]
    assert "does not fit" in memory.detail and "max_running_requests" in memory.fix
    assert "largest term: engine's KV pool" in memory.fix
    # each role too large for a GPU on its own fails on its own line, naming its own largest term
    assert "largest term: engine's KV pool" in failed["engine ×1"].fix
    assert "largest term: trainer rank's activations" in failed["trainer rank ×1"].fix


def test_cuda_asked_for_without_a_gpu_and_a_model_missing_offline_are_failures(tmp_path, monkeypatch) -> None:
    no_gpu = Machine((), 2, 20 * GIB, "2.13.0+cpu", None)
    findings = diagnose(load_run_config(None, [*SMALL, "model.device=cuda"]), no_gpu)
    devices = next(f for f in findings if f.topic == "devices")
    assert devices.status is Status.FAIL and "model.device=cpu" in devices.fix
    use_offline_cache(monkeypatch, tmp_path)
    missing = diagnose(load_run_config(None, [*SMALL, "model.path=nobody/absent"]), no_gpu)
    model = next(f for f in missing if f.topic == "model")
    assert model.status is Status.FAIL and "'nobody/absent'" in model.detail
    assert [f.topic for f in missing if f.topic in ("ram", "disk")] == []  # nothing to size it by


def test_the_tiny_default_is_all_ok_here_and_the_cli_prints_one_line_each(capsys) -> None:
    assert cli.main(["doctor", *SMALL]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith(" ")]
    topics = [line.split(":")[0].split()[-1] for line in lines[:-1]]
    assert topics == ["devices", "model", "task", "ram", "disk", "attention", "ray", "vllm", "bubblewrap"]
    assert all(line.startswith(("OK ", "WARN", "FAIL")) for line in lines[:-1])
    assert lines[-1].startswith("0 FAIL")


def test_a_failure_exits_1_naming_it_and_its_fix(capsys, monkeypatch) -> None:
    monkeypatch.setattr(doctor, "this_machine", lambda: Machine((), 2, 20 * GIB, "2.13.0+cpu", None))
    assert cli.main(["doctor", *SMALL, "model.device=cuda"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  devices: model.device=cuda but no CUDA device is visible" in out
    assert "      fix: run on a GPU machine" in out and "\n1 FAIL" in out


def test_the_attention_implementation_is_checked_against_the_machine() -> None:
    no_gpu = Machine((), 2, 20 * GIB, "2.13.0+cpu", None)
    flex = load_run_config(None, [*SMALL, "model.attn_implementation=flex_attention"])
    failed = check_attention_here(flex, no_gpu)
    assert (
        failed.status is Status.FAIL
        and "model.attn_implementation='flex_attention' needs CUDA" in failed.detail
    )
    assert check_attention_here(flex, h100s(1)).status is Status.OK
    flash = load_run_config(
        None, [*SMALL, "model.attn_implementation=flash_attention_2", "model.dtype=bfloat16"]
    )
    if not is_flash_attn_2_available(kernels_fallback_ok=True):  # this machine: no flash-attn
        assert "needs flash-attn 2" in check_attention_here(flash, h100s(1)).detail
    assert check_attention_here(load_run_config(None, SMALL), no_gpu).status is Status.OK


def test_vllm_needs_its_environment_with_cuda_for_a_gpu_run(tmp_path: Path) -> None:
    config = load_run_config(None, ["engine.backend=vllm", f"engine.vllm.python={tmp_path / 'nope'}"])
    missing = check_vllm(config)
    assert missing.status is Status.FAIL and missing.fix.startswith("asyncrl backends install vllm")
    python = tmp_path / "python"
    python.write_text("")
    config = load_run_config(
        None, ["engine.backend=vllm", f"engine.vllm.python={python}", "model.device=cuda"]
    )

    def cpu_build(command, timeout_s):
        return subprocess.CompletedProcess(command, 0, stdout="0.32.0 False\n", stderr="")

    cpu_only = check_vllm(config, run=cpu_build)
    assert cpu_only.status is Status.FAIL and "--gpu" in cpu_only.fix

    def broken(command, timeout_s):
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ImportError: torchvision::nms\n")

    assert "torchvision::nms" in check_vllm(config, run=broken).detail


def test_a_cluster_is_asked_for_its_resources(tmp_path: Path) -> None:
    config = load_run_config(
        None,
        [
            "runtime.type=cluster",
            "runtime.address=ray://head:10001",
            "model.device=cuda",
            "rollout.num_engines=6",
        ],
    )

    def cluster(gpus: int):
        def run(command, timeout_s):
            assert json.loads(command[-1])["address"] == "ray://head:10001"
            report = {"resources": {"CPU": 64, "GPU": gpus}, "nodes": []}
            return subprocess.CompletedProcess(command, 0, stdout=json.dumps(report), stderr="")

        return run

    assert [f.status for f in check_ray(config, run=cluster(8))] == [Status.OK]  # 1 trainer + 6 engines
    [short] = check_ray(config, run=cluster(4))
    assert short.status is Status.FAIL and "reserves 7" in short.detail

    def unreachable(command, timeout_s):
        raise subprocess.TimeoutExpired(command, timeout_s)

    assert [f.status for f in check_ray(config, run=unreachable)] == [Status.FAIL]


@pytest.mark.parametrize("overrides", [("task.type=code",), ()])
def test_bubblewrap_is_probed_when_the_config_runs_model_code(overrides) -> None:
    findings = diagnose(load_run_config(None, [*SMALL, *overrides]), Machine((), 2, 20 * GIB, "2.13.0", None))
    sandbox = next(f for f in findings if f.topic == "bubblewrap")
    assert sandbox.status is Status.OK
    assert ("runs a sandboxed program" in sandbox.detail) == bool(overrides)


@pytest.mark.parametrize(
    ("runtime", "says"),
    [
        ("inline", "the run downloads it as it starts"),
        ("local", "the driver downloads it before any actor starts"),
        ("cluster", "a node without it fails the start by name"),
    ],
)
def test_a_hub_model_not_cached_online_says_who_downloads_it(tmp_path, monkeypatch, runtime, says) -> None:
    """Online and not cached, doctor says what the run does with it: Ray actors load offline, so on Ray the
    driver fetches it before any actor starts (``runtime.start_files``), and on a cluster each node must hold it."""
    from huggingface_hub import constants

    use_offline_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(doctor, "_fetch_config_only", lambda config: DEFAULT_MODEL_DIR)  # no hub here
    overrides = [f"runtime.type={runtime}", "model.path=someone/uncached"]
    if runtime == "cluster":
        overrides.append("runtime.address=ray://head:10001")
    facts, findings = doctor.check_model(load_run_config(None, overrides))
    warn, ok = findings
    assert warn.status is Status.WARN and says in warn.detail and "someone/uncached" in warn.detail
    assert ok.status is Status.OK and facts is not None and not facts.cached


def shm_free(monkeypatch, free: int) -> None:
    """The bucket files' directory reports ``free`` bytes; every other path its own."""
    real, directory = os.statvfs, shm_room.shm_dir()
    fake = types.SimpleNamespace(f_bavail=free // 4096, f_frsize=4096)
    monkeypatch.setattr(os, "statvfs", lambda path: fake if str(path) == directory else real(path))


def test_shared_memory_is_checked_against_the_bucket_files_of_every_vllm_engine_here(tmp_path, monkeypatch):
    """Docker's default /dev/shm (64 MB) against a vLLM run of an 8B model: each engine holds two bucket files
    at once, the larger the bf16 embedding alone (151936 × 4096 × 2 B = 1.16 GiB), so 2 engines need 4.6 GiB."""
    model = model_like(tmp_path, QWEN3_8B)
    common = (*SMALL, f"model.path={model}", "model.device=cuda", "model.dtype=bfloat16")
    config = load_run_config(None, [*common, "engine.backend=vllm", "rollout.num_engines=2"])
    shape = shape_from_hf_config(QWEN3_8B)
    shm_free(monkeypatch, 64 * 2**20)
    full = check_shared_memory(config, shape)
    embedding = 151936 * 4096 * 2
    assert full.status is Status.FAIL and full.topic == "shared memory" and "does not fit" in full.detail
    assert f"{2 * embedding / 2**20:.1f} MiB per engine" in full.detail and "2 vLLM engine(s)" in full.detail
    assert f"{4 * embedding / 2**20:.1f} MiB in all" in full.detail and "64.0 MiB free" in full.detail
    assert "--shm-size" in full.fix and "weight_sync.bucket_mb" in full.fix
    assert "shared memory" in verdicts(diagnose(config, h100s(2)))  # on doctor's list for this machine
    shm_free(monkeypatch, 16 * GIB)
    assert check_shared_memory(config, shape).status is Status.OK  # 16 GiB free
    builtin = load_run_config(None, list(common))
    assert check_shared_memory(builtin, shape) is None  # no bucket files: no line
