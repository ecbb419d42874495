#!/usr/bin/env bash
# Rehearse the GPU kit with the lent GPU machine's own library versions, on this CPU machine.
# The lent machine has torch 2.11.0+cu130 and transformers 5.17.0 (its smoke logs, docs/gpu-smoke/), not the
# versions asyncrl pins (torch 2.13.0, transformers 5.23.0), and no Ray, no vLLM, no registry. A kit that passes
# its dry run here can still fail there on an API one of those versions lacks; this builds a venv at that
# machine's versions (torch's CUDA build, about 5 GB: the CPU build of 2.11 is not on the registry; it runs on the
# CPU all the same) and runs `scripts/gpu-smoke.sh --dry-run` in it. Needs a quiet machine: each section runs
# under the kit's own time limits.
# Usage: scripts/gpu-twin.sh [VENV_DIR]   (default: $ASYNCRL_GPU_TWIN_VENV or ~/.cache/asyncrl/gpu-twin-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${ASYNCRL_GPU_TWIN_VENV:-$HOME/.cache/asyncrl/gpu-twin-venv}}"
if ! "$venv/bin/python" -c "import torch, transformers, pytest" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  # What the lent machine has (MACHINE-NOTES, "The GPU machine"), and pytest for the kit's unit section.
  "$venv/bin/pip" install --quiet "torch==2.11.0" "transformers==5.17.0" safetensors tokenizers pyyaml peft \
    tensorboard numpy pytest
fi
"$venv/bin/python" -c "import torch, transformers; print('gpu twin: torch', torch.__version__, '| transformers', transformers.__version__)"
PYTHON="$venv/bin/python" OUT="${OUT:-runs/gpu-twin}" exec bash scripts/gpu-smoke.sh --dry-run
