"""The lent-GPU scripts (the colocated transport's, the GPU kit's weight-bucket section) run their CPU twins
here, so they cannot rot between GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_gpu_weight_sync_script_runs_its_shared_memory_twin_exactly(tmp_path, user_env):
    out = tmp_path / "weight_sync_cpu.json"
    done = subprocess.run(
        [sys.executable, "scripts/gpu_weight_sync.py", "--device", "cpu", "--out", str(out)],
        cwd=ROOT,
        env=user_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    arms = result["arms"]
    assert {"shm/tiny/bfloat16", "shm/tiny/float32", "in_process/tiny/bfloat16"} <= set(arms)
    assert all(arms[name]["exact"]["median"] == 1.0 for name in arms if name.startswith("shm/"))


def test_the_gpu_kit_weight_bucket_section_runs_its_cpu_twin_through_the_broadcast_receive(
    tmp_path, user_env
):
    """``scripts/gpu-smoke.sh``'s weight-buckets section as its ``--dry-run`` runs it (the checkout on
    ``PYTHONPATH``): both arms bit-exact, the broadcast's buckets reaching the engine as tensors where they were
    received, the receiver within two buckets, and each arm's peak allocation (the profiler's, on CPU) within
    what its buckets hold by design: a leaked view of the previous bucket's buffer fails it."""
    done = subprocess.run(
        [sys.executable, "scripts/gpu_checks/weight_buckets.py", "--device", "cpu", "--out", str(tmp_path)],
        cwd=ROOT,
        env=user_env | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert all(check["passed"] for check in result["checks"].values())
    assert {
        "bit-exact",
        "staging",
        "broadcast bit-exact",
        "broadcast on device",
        "broadcast receiver held",
        "broadcast staging",
    } <= set(result["checks"])
    assert result["staging_peak_bytes"] > 0 and result["broadcast"]["staging_peak_bytes"] > 0  # it measured
    assert result["broadcast"]["buckets_held_as"] == ["Tensor on cpu"]
