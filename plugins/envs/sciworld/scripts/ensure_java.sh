#!/usr/bin/env bash
# Installs a headless Java runtime (8 or newer; 17 is tested) when `java` is missing.
# The sciworld environment (plugins/envs/sciworld) runs ScienceWorld's bundled jar on it.
# Idempotent: with `java` on PATH it does nothing.
# Usage: plugins/envs/sciworld/scripts/ensure_java.sh
set -euo pipefail
exec bash "$(dirname "$0")/../../../../scripts/apt_ensure.sh" ensure_java java default-jre-headless
