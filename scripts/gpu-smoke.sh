#!/usr/bin/env bash
# GPU smoke checks: run where a CUDA device is present; says "no CUDA device" and exits 0 elsewhere.
# Every section runs even when an earlier one fails; the end lists each as PASS, FAIL or NOT CHECKED (with the
# reason) and the exit status is non-zero if any failed. What has run on a GPU, and what never has, is in
# docs/scaling.md ("What has and has not run on a GPU").
# Usage: scripts/gpu-smoke.sh   (PYTHON=... picks the interpreter; ASYNCRL_GPU_SMOKE_OUT the run folder)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
out=${ASYNCRL_GPU_SMOKE_OUT:-runs/gpu-smoke}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: nothing to smoke-test here"
  exit 0
fi
$PY -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
'|', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))"
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
HAVE_RAY=$($PY -c "import ray" 2>/dev/null && echo 1 || echo 0)

summary=()
check() {  # name command...: run one section and record its outcome
  local name=$1; shift
  echo; echo "== $name"
  local start=$SECONDS
  if "$@"; then summary+=("PASS         $name ($((SECONDS - start)) s)")
  else summary+=("FAIL         $name ($((SECONDS - start)) s)"); fi
}
not_checked() {  # name reason
  echo; echo "== $1: NOT CHECKED ($2)"
  summary+=("NOT CHECKED  $1: $2")
}
train() {  # output name, then [config.yaml] overrides: an RL run on CUDA (default: the default task and model)
  local name=$1; shift
  $PY -m asyncrl.cli.main train "$@" model.device=cuda metrics.progress=lines output_dir="$out/$name"
}
default_run_learns() {  # the README's default run on CUDA; fails unless its held-out reward rose
  train default || return 1
  $PY - "$out/default/summary.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
before, after = summary["eval_before"]["eval/reward_mean"], summary["eval_after"]["eval/reward_mean"]
print(f"held-out reward {before:.3f} -> {after:.3f} ({after - before:+.3f}) in {summary['wall_s']:.0f} s")
sys.exit(0 if after > before else 1)
PY
}

check "engine, trainer, loss and packing tests with their models on CUDA (the CPU suite's assertions)" \
  env ASYNCRL_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -q \
  tests/unit/engine/test_engine_numerics.py tests/unit/engine/test_engine_architectures.py \
  tests/unit/engine/test_engine_batched_prefill.py tests/unit/trainer/test_trainer_device.py \
  tests/unit/trainer/test_trainer_packing.py tests/unit/losses/test_losses_device.py
check "FSDP2 over NCCL ($GPUS rank(s), one per GPU) against one process" $PY scripts/gpu_fsdp_check.py
check "LoRA on CUDA: FSDP2 + peft over NCCL against one process, adapter log-probs, the engine's merge" \
  $PY scripts/gpu_lora_check.py
check "RL run on CUDA: inline runtime, async alpha = 2, built-in engine, 20 steps" \
  train async controller.num_steps=20 controller.eval_prompts=64
check "RL run on CUDA: sync mode, bfloat16 training, 10 steps" \
  train sync-bf16 controller.mode=sync buffer.async_ratio=0 trainer.compute_dtype=bfloat16 controller.num_steps=10 \
  controller.eval_prompts=64
check "RL run on CUDA with LoRA (rank 8, adapter-only weight sync), 10 steps" \
  train lora trainer.lora.rank=8 controller.num_steps=10 controller.eval_prompts=64
check "RL run on CUDA: PPO with a separate critic and GAE, 10 steps" \
  train gae advantage.name=gae critic.type=separate controller.num_steps=10 controller.eval_prompts=64
check "the default run (150 steps) on CUDA learns: held-out reward rises" default_run_learns

venv=${ASYNCRL_VLLM_VENV:-$HOME/.cache/asyncrl/vllm-venv}
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  check "vLLM (CUDA wheel): backend tests and RL run" bash scripts/test-vllm.sh --gpu "$venv"
else
  not_checked "vLLM on CUDA" "no vLLM environment at $venv (scripts/install-vllm.sh --gpu makes one; needs a registry)"
fi

if [[ $HAVE_RAY == 0 ]]; then
  not_checked "Ray runtimes on GPUs (num_gpus placement, NCCL trainer ranks as actors, NCCL broadcast into vLLM)" \
    "ray is not installed in this Python"
elif [[ $GPUS -lt 2 ]]; then
  not_checked "vLLM weight broadcast over NCCL" "needs 2 GPUs (NCCL cannot join trainer and vLLM on one device)"
  not_checked "sharded RL run on Ray with GPUs" "needs 3 GPUs (2 trainer ranks, 1 engine)"
else
  check "vLLM on Ray, weights broadcast over NCCL from the trainer into vLLM's worker (2 GPUs)" \
    train vllm-broadcast engine.backend=vllm runtime.type=local trainer.num_workers=1 rollout.num_engines=1 \
    weight_sync.type=broadcast proxy.max_engine_restarts=0 controller.num_steps=10 controller.eval_prompts=64
  if [[ $GPUS -ge 3 ]]; then
    check "RL run on Ray: a 2-rank NCCL trainer and one engine, each on its own GPU" \
      train distributed asyncrl/examples/distributed.yaml trainer.num_workers=2 rollout.num_engines=1 \
      controller.num_steps=10 controller.eval_prompts=64
    check "the same with weights broadcast over NCCL from trainer rank 0 to the engine" \
      train broadcast asyncrl/examples/distributed.yaml trainer.num_workers=2 rollout.num_engines=1 \
      controller.num_steps=10 controller.eval_prompts=64 weight_sync.type=broadcast proxy.max_engine_restarts=0
  else
    not_checked "sharded RL run on Ray with GPUs" "needs 3 GPUs (2 trainer ranks, 1 engine)"
  fi
fi

echo; echo "== summary"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q '^FAIL'
