#!/usr/bin/env bash
# GPU smoke checks: run where a CUDA device is present; says "no CUDA device" and exits 0 elsewhere.
# Each section is one check; add sections as GPU paths land. What has never run on a GPU is listed in
# docs/backends.md and docs/scaling notes of the issues.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: nothing to smoke-test here"
  exit 0
fi

echo "== a short RL run on CUDA (built-in engine)"
python -m asyncrl.cli.main train model.device=cuda controller.num_steps=10 controller.eval_prompts=64 \
  output_dir=runs/gpu-smoke/builtin metrics.progress=lines

echo "== vLLM (CUDA wheel) tests and RL run"
bash scripts/test-vllm.sh --gpu
