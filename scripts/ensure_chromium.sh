#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium and its WebDriver when either is missing.
# The webnav environment (plugins/envs/webnav) drives MiniWoB++ pages in this browser.
# Idempotent: with both `chromium` and `chromedriver` on PATH it does nothing.
# Usage: scripts/ensure_chromium.sh
set -euo pipefail
exec bash "$(dirname "$0")/apt_ensure.sh" ensure_chromium "chromium chromedriver" \
    chromium chromium-driver fonts-dejavu-core
