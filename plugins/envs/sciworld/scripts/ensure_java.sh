#!/usr/bin/env bash
# Installs a headless Java runtime when `java` is missing.
# The sciworld environment (plugins/envs/sciworld) runs ScienceWorld's bundled jar on it.
# Idempotent: with `java` on PATH it does nothing.
# Usage: plugins/envs/sciworld/scripts/ensure_java.sh
set -euo pipefail

if command -v java >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_java: java is missing and there is no apt-get; install a Java runtime" \
        "(8 or newer; 17 is tested) with your package manager" >&2
    exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure_java: not root and no sudo; run as root: apt-get install -y default-jre-headless" >&2
        exit 1
    fi
    SUDO=(sudo)
fi

echo "ensure_java: installing default-jre-headless with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends default-jre-headless

command -v java >/dev/null
