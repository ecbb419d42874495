#!/usr/bin/env bash
# The colocated weight transport on a lent GPU: CUDA IPC handles between a trainer process and an engine process
# on one GPU, Qwen2-shaped random weights of 0.5B, 1.5B and 7B (bfloat16; 0.5B also float32), 3 interleaved
# repeats: seconds, GB/s, peak extra GPU memory each side, bit-exactness; an in-process device copy beside it.
# Needs only torch + CUDA (the project is read from this checkout, nothing installed). About 2 minutes on one
# H100/H200. Elsewhere it says "no CUDA device" and exits 0 (its CPU twin runs in the test suite).
# Usage: scripts/gpu-weight-sync.sh [OUT_DIR]   (PYTHON=... picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-runs/gpu-weight-sync}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: nothing to measure here (scripts/gpu_weight_sync.py --device cpu runs the CPU twin)"
  exit 0
fi
mkdir -p "$out"
name=$(date -u +%Y-%m-%d)-$($PY -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())")
export ASYNCRL_BENCH_COMMIT=${ASYNCRL_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  $PY scripts/gpu_weight_sync.py --out "$out/$name-weight_sync_cuda.json"
} 2>&1 | tee "$out/$name-weight-sync.log"
