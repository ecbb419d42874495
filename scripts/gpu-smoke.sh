#!/usr/bin/env bash
# GPU smoke checks: run where a CUDA device is present; says "no CUDA device" and exits 0 elsewhere.
# Each section is one check; add sections as GPU paths land. What has never run on a GPU is listed in
# docs/backends.md and docs/scaling.md ("What has and has not run on a GPU").
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

GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -ge 2 ]; then
  echo "== FSDP2 over NCCL: one sharded step against one process ($GPUS GPUs)"
  python scripts/gpu_fsdp_check.py
  # NEVER RUN ON A GPU so far: only its CPU twin (gloo into vLLM's CPU worker) is tested
  # (tests/integration/test_vllm_engine.py, the broadcast test).
  echo "== vLLM on Ray, weights broadcast over NCCL from the trainer straight into vLLM's worker (2 GPUs)"
  python -m asyncrl.cli.main train engine.backend=vllm runtime.type=local model.device=cuda \
    trainer.num_workers=1 rollout.num_engines=1 weight_sync.type=broadcast proxy.max_engine_restarts=0 \
    controller.num_steps=10 controller.eval_prompts=64 output_dir=runs/gpu-smoke/vllm-broadcast \
    metrics.progress=lines
else
  echo "== only $GPUS GPU: the NCCL trainer needs one GPU per rank; FSDP2 over NCCL was NOT checked"
  echo "== only $GPUS GPU: NCCL needs the trainer and vLLM on different GPUs; the vLLM broadcast was NOT checked"
fi
if [ "$GPUS" -ge 3 ]; then
  echo "== a short RL run on Ray: a 2-rank NCCL trainer and one engine, each on its own GPU"
  python -m asyncrl.cli.main train asyncrl/examples/distributed.yaml model.device=cuda trainer.num_workers=2 \
    rollout.num_engines=1 controller.num_steps=10 controller.eval_prompts=64 \
    output_dir=runs/gpu-smoke/distributed metrics.progress=lines
  echo "== the same with weights broadcast over NCCL from trainer rank 0 to the engine"
  python -m asyncrl.cli.main train asyncrl/examples/distributed.yaml model.device=cuda trainer.num_workers=2 \
    rollout.num_engines=1 controller.num_steps=10 controller.eval_prompts=64 weight_sync.type=broadcast \
    proxy.max_engine_restarts=0 output_dir=runs/gpu-smoke/broadcast metrics.progress=lines
else
  echo "== fewer than 3 GPUs: the sharded RL run on Ray with GPUs was NOT checked"
fi
