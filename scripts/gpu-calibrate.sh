#!/usr/bin/env bash
# Measure a lent GPU for the simulator's cost model (asyncrl calibrate): GEMM and bandwidth ceilings, and for
# Qwen3-shaped models of 0.6B, 1.7B, 4B and 8B (random bf16 weights) decode steps over batch and KV length,
# engine steps, prefill and packed training. Needs only torch + CUDA and transformers (the project is read from
# this checkout, nothing installed). About five minutes on one H100/H200; sections past --budget-s are skipped
# and listed as not measured. Elsewhere it says "no CUDA device" and exits 0 (the CPU check is --quick, a test).
# Usage: scripts/gpu-calibrate.sh [OUT_DIR] [asyncrl calibrate options...]   (PYTHON=... picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-runs/calibrate}
shift $(( $# > 0 ? 1 : 0 ))
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: nothing to calibrate here (asyncrl calibrate --quick checks the kit on a CPU)"
  exit 0
fi
mkdir -p "$out"
name=$(date -u +%Y-%m-%d)-$($PY -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())")
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  $PY -m asyncrl.cli.main calibrate --out "$out/$name-probe.json" "$@"
} 2>&1 | tee "$out/$name-probe.log"
