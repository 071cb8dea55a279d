#!/usr/bin/env bash
# Installs Debian's bubblewrap (bwrap) when it is missing: the Python sandbox
# (agentgym_core/sandbox.py, docs/sandbox.md) runs model-written code under it.
# Idempotent: with `bwrap` and `prlimit` on PATH it does nothing.
# Usage: scripts/ensure_bubblewrap.sh
set -euo pipefail
exec bash "$(dirname "$0")/apt_ensure.sh" ensure_bubblewrap "bwrap prlimit" bubblewrap util-linux
