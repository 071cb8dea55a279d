#!/usr/bin/env bash
# Installs Debian packages with apt-get when any of the commands they provide is missing.
# Idempotent: with every command on PATH it does nothing. Tries the package lists it has
# first and updates them only when that fails. The ensure_*.sh scripts call it.
# Usage: scripts/apt_ensure.sh NAME "COMMAND [COMMAND...]" PACKAGE [PACKAGE...]
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: scripts/apt_ensure.sh NAME \"COMMAND [COMMAND...]\" PACKAGE [PACKAGE...]" >&2
    exit 2
fi
name=$1
read -r -a commands <<<"$2"
shift 2
packages=("$@")

present() {
    local command
    for command in "${commands[@]}"; do
        command -v "$command" >/dev/null 2>&1 || return 1
    done
}

if present; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: ${commands[*]} missing and there is no apt-get;" \
        "install ${packages[*]} (or their equivalents) with your package manager" >&2
    exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "$name: not root and no sudo; run as root: apt-get install -y ${packages[*]}" >&2
        exit 1
    fi
    SUDO=(sudo)
fi

echo "$name: installing ${packages[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
install=("${SUDO[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}")
if ! "${install[@]}"; then
    "${SUDO[@]}" apt-get update -q
    "${install[@]}"
fi

if ! present; then
    echo "$name: installed ${packages[*]} but ${commands[*]} still not all on PATH" >&2
    exit 1
fi
