#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium and its WebDriver when either is missing.
# The webnav environment (plugins/envs/webnav) drives MiniWoB++ pages in this browser.
# Idempotent: with both `chromium` and `chromedriver` on PATH it does nothing.
# Usage: scripts/ensure_chromium.sh
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: chromium/chromedriver are missing and there is no apt-get;" \
        "install Chromium and its matching chromedriver with your package manager" >&2
    exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure_chromium: not root and no sudo; run as root: apt-get install -y chromium chromium-driver" >&2
        exit 1
    fi
    SUDO=(sudo)
fi

echo "ensure_chromium: installing chromium and chromium-driver with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-dejavu-core

command -v chromium >/dev/null && command -v chromedriver >/dev/null
