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
# libvirt: guests through libvirtd ([method] platform = "libvirt" with libvirt_uri); virsh is in
# libvirt-clients, which libvirt-daemon-system depends on
packages="$packages libvirt-daemon-system"
# the guests' fio: a static build of the host's fio version from its Debian source, with the server
# patch (iomatrix/appliance/guestfio.py); libaio-dev for the libaio engine, flex/bison for job math
packages="$packages gcc make libc6-dev dpkg-dev libaio-dev zlib1g-dev flex bison libfl-dev"
# mkfs.ext4, mkfs.xfs and mkfs.btrfs: filesystems a run makes on a loop device ([target] filesystems;
# e2fsprogs is not in a minimal Debian 13 root)
packages="$packages e2fsprogs xfsprogs btrfs-progs"
# ioping: host-mode ioping workloads (seed 001 §9) run it; without it fio's equivalent job runs
packages="$packages ioping"
[ "$dev" = 1 ] && packages="$packages chromium libxml2-utils"   # xmllint, for virt-xml-validate

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

# libvirt runs QEMU as its own user. Debian's udev rule gives /dev/kvm to group kvm (0660); where a
# host left it root-only, libvirt re-probes QEMU on every domain start (about 50 s each).
if [ -c /dev/kvm ] && [ "$(stat -c %G:%a /dev/kvm)" = "root:600" ] && getent group kvm >/dev/null; then
    if ${sudo:-} chgrp kvm /dev/kvm && ${sudo:-} chmod 0660 /dev/kvm; then
        echo "setup.sh: /dev/kvm set to root:kvm 0660 (Debian's default) so libvirt's QEMU can open it"
    fi
fi

# libvirtd: systemd starts it where systemd runs; elsewhere (containers) start it by hand.
if ! virsh -c qemu:///system -q version >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        ${sudo:-} systemctl start libvirtd || true
    elif [ "$(id -u)" = 0 ]; then
        pgrep -x virtlogd >/dev/null || virtlogd -d || true
        pgrep -x libvirtd >/dev/null || libvirtd -d || true
    fi
fi

# uv is pinned and lives in the environment it manages; --inexact keeps it there. It trusts the
# system's certificate store (a site CA added with update-ca-certificates), as apt and pip do.
export UV_NATIVE_TLS=1
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
