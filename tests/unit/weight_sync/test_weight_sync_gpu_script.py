"""The lent-GPU script of the colocated transport runs its CPU twin here, so it cannot rot between GPUs."""

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
