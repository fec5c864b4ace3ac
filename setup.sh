#!/bin/sh
# Installs what iomatrix needs on a Debian/Ubuntu/Proxmox host: the QEMU and fio packages, then a
# Python environment in ./.venv from the lock file (uv.lock). With --dev it adds the test tools and
# Debian's chromium, which the report tests drive. Safe to run again; it only adds what is missing.
set -eu
cd "$(dirname "$0")"

dev=0
for arg in "$@"; do
    case "$arg" in
        --dev) dev=1 ;;
        -h|--help) echo "usage: ./setup.sh [--dev]"; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

packages="qemu-system-x86 qemu-system-common qemu-utils fio fuse3 python3 python3-venv ca-certificates"
[ "$dev" = 1 ] && packages="$packages chromium"

missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install:$missing" >&2; exit 1; }
        sudo=sudo
    fi
    echo "setup.sh: installing Debian packages:$missing"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
fi

# uv is pinned and lives in the environment it manages; --inexact keeps it there.
if [ ! -x .venv/bin/uv ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check "uv==0.13.9"
fi
if [ "$dev" = 1 ]; then
    .venv/bin/uv sync -q --frozen --inexact --compile-bytecode --extra dev --python .venv/bin/python
else
    .venv/bin/uv sync -q --frozen --inexact --compile-bytecode --python .venv/bin/python
fi
echo "setup.sh: ready: .venv/bin/iomatrix"
