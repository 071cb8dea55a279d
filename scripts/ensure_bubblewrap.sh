#!/usr/bin/env bash
# Installs Debian's bubblewrap (bwrap) when it is missing: the Python sandbox
# (agentgym_core/sandbox.py, docs/sandbox.md) runs model-written code under it.
# Idempotent: with `bwrap` and `prlimit` on PATH it does nothing.
# Usage: scripts/ensure_bubblewrap.sh
set -euo pipefail

if command -v bwrap >/dev/null 2>&1 && command -v prlimit >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_bubblewrap: bwrap or prlimit is missing and there is no apt-get;" \
        "install bubblewrap and util-linux with your package manager" >&2
    exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure_bubblewrap: not root and no sudo; run as root: apt-get install -y bubblewrap util-linux" >&2
        exit 1
    fi
    SUDO=(sudo)
fi

echo "ensure_bubblewrap: installing bubblewrap with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
if ! "${SUDO[@]}" apt-get install -y -q --no-install-recommends bubblewrap util-linux; then
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends bubblewrap util-linux
fi
