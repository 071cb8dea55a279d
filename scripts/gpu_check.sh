#!/usr/bin/env bash
# bash scripts/gpu_check.sh [--setup-only] [benchmarks/gpu_check.py options, e.g. --sizes 0.5b]
#
# The GPU check on a GPU machine with no network (docs/gpu.md). It builds .venv-gpu over
# the machine's own torch, transformers, accelerate and peft (--system-site-packages),
# installs the few wheels the core needs beyond them from scripts/gpu_wheels (never from an
# index), the core and the grpo plugin editable without their dependencies, then runs
# benchmarks/gpu_check.py. --setup-only stops after the venv (then `make test-gpu`, and with
# .gpu-wheels from `make gpu-wheels`, `make test-gpu-runs`).
# PYTHON picks the interpreter that holds torch (default python3); GPU_VENV the venv folder.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${GPU_VENV:-.venv-gpu}
WHEELS=scripts/gpu_wheels
say() { echo "[gpu_check.sh] $*"; }

setup_only=0
if [ "${1:-}" = "--setup-only" ]; then
    setup_only=1
    shift
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV over $("$PYTHON" -c 'import sys; print(sys.executable)')"
    # without a pip of its own: $PYTHON's pip and setuptools install into it (ensurepip's
    # bundled ones may be older, or missing)
    "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
    echo '*' >"$VENV/.gitignore"
    # A venv made from another venv (python3 there may be one) sees the base interpreter's
    # packages, not that venv's: list $PYTHON's own site-packages after the new venv's.
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/gpu_check_base.pth"
fi
PY="$VENV/bin/python"
if "$PY" -m pip --version >/dev/null 2>&1; then
    PIP=("$PY" -m pip)
else
    PIP=("$PYTHON" -m pip --python "$PY")
fi

"$PY" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"[gpu_check.sh] this machine's python lacks {missing}: set PYTHON to the one with torch")
EOF

say "installing $WHEELS (offline) and the core"
"${PIP[@]}" install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
    -r "$WHEELS/requirements.txt"
if ! PYTHONWARNINGS=ignore::UserWarning "${PIP[@]}" install -q --disable-pip-version-check \
    --no-index --no-deps --no-build-isolation -e . -e plugins/algorithms/grpo; then
    # the machine's setuptools could not build the editable install: import from the checkout
    say "editable install failed: using PYTHONPATH instead"
    export PYTHONPATH="$PWD:$PWD/plugins/algorithms/grpo${PYTHONPATH:+:$PYTHONPATH}"
fi

# With .gpu-wheels (`make gpu-wheels`, fetched where there is network): what whole runs need,
# and the plugins `make test-gpu-runs` trains with, editable without their dependencies.
RUN_WHEELS=${GPU_RUN_WHEELS:-.gpu-wheels}
GPU_RUNS=""
if [ -d "$RUN_WHEELS" ]; then
    GPU_RUNS=1
    say "installing $RUN_WHEELS (offline) and the plugins of the GPU runs"
    "${PIP[@]}" install -q --disable-pip-version-check --no-index --find-links "$RUN_WHEELS" \
        --find-links "$WHEELS" -r "$WHEELS/runs.txt"
    editable=()
    for plugin in envs/babyai schedulers/fixed schedulers/scaling_inter schedulers/adaptive \
        algorithms/sft algorithms/dpo algorithms/ppo algorithms/rloo algorithms/reinforce_pp \
        algorithms/gigpo; do
        editable+=(-e "plugins/$plugin")
    done
    PYTHONWARNINGS=ignore::UserWarning "${PIP[@]}" install -q --disable-pip-version-check \
        --no-index --no-deps --no-build-isolation "${editable[@]}"
fi

GPU_RUNS=$GPU_RUNS "$PY" - <<'EOF'
import importlib.metadata as md
import os
import torch
names = ["torch", "transformers", "accelerate", "peft", "pydantic", "omegaconf", "agentgym-core"]
if os.environ.get("GPU_RUNS"):
    names += ["mlflow-skinny", "minigrid"]
versions = []
for name in names:
    try:
        versions.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        versions.append(f"{name} missing")
card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"[gpu_check.sh] {card}; " + ", ".join(versions))
EOF

if [ "$setup_only" = 1 ]; then
    say "ready: make test-gpu${GPU_RUNS:+, make test-gpu-runs}, or $PY benchmarks/gpu_check.py"
    exit 0
fi
PYTHONUNBUFFERED=1 exec "$PY" benchmarks/gpu_check.py "$@"
