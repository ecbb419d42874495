#!/usr/bin/env bash
# Create or re-use the vLLM environment, run the vLLM backend tests, then a 30-step async (alpha = 2) RL run on
# engine.backend=vllm beside the same run on the built-in engine; non-zero exit on any failure, or when the
# vLLM run's held-out reward does not rise. Usage: scripts/test-vllm.sh [--gpu] [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-vllm.sh "$@"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled
python -m pytest -m vllm tests/integration/test_vllm_engine.py tests/integration/test_vllm_sleep.py \
  tests/integration/test_vllm_streamed_broadcast.py -q
out=${ASYNCRL_VLLM_TEST_OUT:-runs/test-vllm}
run() {  # backend
  python -m asyncrl.cli.main train controller.num_steps=30 controller.eval_prompts=256 task.num_eval=256 \
    engine.backend="$1" output_dir="$out/$1" metrics.progress=lines
}
run builtin
run vllm
echo "== vLLM engines as Ray actors (each actor starts its worker in its placement bundle)"
python -m asyncrl.cli.main train controller.num_steps=10 controller.eval_prompts=64 engine.backend=vllm \
  runtime.type=local rollout.num_engines=2 output_dir="$out/vllm-ray" metrics.progress=lines
python - "$out" <<'PY'
import json, sys
gains = {}
for backend in ("builtin", "vllm"):
    summary = json.load(open(f"{sys.argv[1]}/{backend}/summary.json"))
    before, after = summary["eval_before"]["eval/reward_mean"], summary["eval_after"]["eval/reward_mean"]
    gains[backend] = after - before
    print(f"{backend}: held-out reward {before:.3f} -> {after:.3f} ({after - before:+.3f}) in {summary['wall_s']:.0f} s")
if gains["vllm"] <= 0:
    sys.exit("the vLLM run's held-out reward did not rise")
PY
