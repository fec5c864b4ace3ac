#!/bin/sh
# Installs what iomatrix needs on a Debian/Ubuntu/Proxmox VE host: the QEMU and fio packages, then a
# Python environment in ./.venv from the lock file (uv.lock). With --dev it adds the test tools and
# Debian's chromium, which the report tests drive. Safe to run again; it only adds what is missing
# and never removes or replaces what the host has: a package that an installed one Provides (Proxmox
# VE's pve-qemu-kvm provides qemu-system-x86 and qemu-utils) or Conflicts with is not installed, nor
# one whose programs are on PATH already (a QEMU, fio or libvirt built elsewhere); it says what it uses.
set -eu
cd "$(dirname "$0")"

usage="usage: ./setup.sh [--dev] [--dry-run [--admindir DIR]]
  --dev           also install the test tools and Debian's chromium (the report tests drive it)
  --dry-run       say what setup would use and install (apt-get -s), and change nothing
  --admindir DIR  with --dry-run: decide against the dpkg database in DIR (DIR/status) instead of
                  the host's (tests/scenarios/test_setup.py simulates Proxmox VE hosts with it)"
dev=0
dry=0
admindir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dev) dev=1 ;;
        --dry-run) dry=1 ;;
        --admindir)
            [ $# -gt 1 ] || { echo "setup.sh: --admindir needs a directory" >&2; exit 2; }
            admindir=$2
            shift ;;
        -h|--help) echo "$usage"; exit 0 ;;
        *) echo "setup.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -n "$admindir" ] && [ "$dry" = 0 ]; then
    echo "setup.sh: --admindir goes with --dry-run (apt would install into this host by another's database)" >&2
    exit 2
fi

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
# Ceph RBD and other network targets: QEMU's rbd/iscsi/nfs block drivers (librbd, libiscsi, libnfs;
# pve-qemu-kvm has them built in) and the rbd command, which makes and removes a run's images
packages="$packages qemu-block-extra ceph-common"
[ "$dev" = 1 ] && packages="$packages chromium libxml2-utils"   # xmllint, for virt-xml-validate
[ "$dev" = 1 ] && packages="$packages fio-examples"   # fio's examples/, which the job file tests load
# PostgreSQL: the store tests start a server of their own in a temporary directory (initdb, pg_ctl)
[ "$dev" = 1 ] && packages="$packages postgresql"
# a single-node Ceph cluster (one mon, mgr and OSD in the test's directory) the RBD tests run against
[ "$dev" = 1 ] && packages="$packages ceph-mon ceph-mgr ceph-osd"
# xorriso: the NoCloud seed (an ISO with user-data, meta-data and the guests' fio) that starts fio
# in the user's own cloud image ([guest] image; iomatrix/guestimage/seed.py)
packages="$packages xorriso"
# mmdebstrap: the tests' small Debian 12 guest image with its own kernel and cloud-init ([guest] image)
[ "$dev" = 1 ] && packages="$packages mmdebstrap"
# tgt: a userspace iSCSI target (tgtd) serving a file-backed LUN the iSCSI tests run against
[ "$dev" = 1 ] && packages="$packages tgt"
# openssh-server: the cluster tests start an sshd of their own per node (a network namespace each)
[ "$dev" = 1 ] && packages="$packages openssh-server"
# Windows guests: fio.exe cross-built with mingw-w64 from the host fio's Debian source
# (iomatrix/appliance/winfio.py), and Wine, under which the tests run it (windowsaio, --server)
[ "$dev" = 1 ] && packages="$packages gcc-mingw-w64-x86-64-posix binutils-mingw-w64-x86-64 wine"

dpkg_query() {
    if [ -n "$admindir" ]; then dpkg-query --admindir="$admindir" "$@"; else dpkg-query "$@"; fi
}
apt_simulate() {
    if [ -n "$admindir" ]; then apt-get -s -o "Dir::State::status=$admindir/status" "$@"; else apt-get -s "$@"; fi
}
installed_list() {
    dpkg_query -W -f='${db:Status-Abbrev}|${Package}|${Version}|${Provides}|${Conflicts}\n' |
        awk -F'|' '$1 == "ii "'
}
installed=$(installed_list)
# The installed package (name and version) that is $1 (field 2), Provides it (4) or Conflicts with
# any version of it (5: a versioned Conflicts is an upgrade path, libvirt-daemon's "libvirt-daemon-
# system (<< 10.6.0-2~)", which apt resolves); nothing when there is none.
installed_by() {
    printf '%s\n' "$installed" | awk -F'|' -v want="$1" -v field="$2" '{
        n = split($field, names, /, */)
        for (i = 1; i <= n; i++) {
            if (field == 5 && names[i] ~ /\(/) continue
            sub(/[ :].*/, "", names[i])          # a version "(= 1.0)" or an arch ":any"
            if (names[i] == want) { print $2 " " $3; exit }
        }
    }'
}
# The programs iomatrix runs from a package: where all are on PATH (a build in /usr/local, another
# vendor's QEMU), the package is not needed.
programs() {
    case "$1" in
        qemu-system-x86) echo qemu-system-x86_64 ;;
        qemu-system-common) echo qemu-storage-daemon ;;
        qemu-utils) echo qemu-img ;;
        fio) echo fio ;;
        libvirt-daemon-system) echo virsh libvirtd ;;
    esac
}
on_path() (         # the paths of the programs $*, or failure when one is missing
    PATH="$PATH:/usr/sbin:/sbin"
    found=""
    for program in "$@"; do
        found="$found $(command -v "$program")" || exit 1
    done
    echo "${found# }"
)

# Proxmox VE: pveversion says which; its QEMU is pve-qemu-kvm (below, by its Provides)
pve=""
if command -v pveversion >/dev/null; then
    pve=$(timeout 10 pveversion 2>/dev/null | head -n 1) || true
    pve="Proxmox VE (${pve:-pveversion printed nothing})"
elif [ -n "$(installed_by proxmox-ve 2)" ]; then
    pve="Proxmox VE ($(installed_by proxmox-ve 2))"
fi

missing=""
for p in $packages; do
    [ -z "$(installed_by "$p" 2)" ] && [ -z "$(installed_by "$p" 4)" ] || continue
    other=$(installed_by "$p" 5)
    if [ -n "$other" ]; then
        echo "setup.sh: not installing $p: the installed $other conflicts with it"
        continue
    fi
    if [ -n "$(programs "$p")" ] && found=$(on_path $(programs "$p")) && [ -n "$found" ]; then
        echo "setup.sh: not installing $p: using $found"
        continue
    fi
    if [ "$p" = qemu-block-extra ] && [ -n "$(installed_by pve-qemu-kvm 2)" ]; then
        # Debian's block modules belong to Debian's QEMU, which pve-qemu-kvm replaces
        echo "setup.sh: not installing qemu-block-extra: pve-qemu-kvm has the rbd and iscsi drivers built in"
        continue
    fi
    if [ "$p" = libvirt-daemon-system ] && [ -n "$pve" ]; then
        # PVE 9's libvirt QEMU driver depends on Debian's QEMU (qemu-kvm | qemu-system), which
        # pve-qemu-kvm conflicts with; and PVE runs its VMs through qemu-server, not libvirt
        echo "setup.sh: not installing libvirt on $pve: Proxmox VE runs VMs through qemu-server," \
             "and libvirt's QEMU driver wants Debian's QEMU; iomatrix's libvirt features will say libvirt is missing"
        continue
    fi
    missing="$missing $p"
done

# What QEMU iomatrix will run: the package that is or provides qemu-system-x86, and its programs.
say_qemu() {
    from=$(installed_by qemu-system-x86 2)
    [ -n "$from" ] || from=$(installed_by qemu-system-x86 4)
    where=""
    for program in qemu-system-x86_64 qemu-img qemu-storage-daemon; do
        where="$where $(command -v "$program" || echo "(no $program)")"
    done
    echo "setup.sh: using ${from:-no Debian package} for QEMU:$where"
}

sudo=""
if [ -n "$missing" ]; then
    if [ "$dry" = 0 ] && [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install:$missing" >&2; exit 1; }
        sudo=sudo
    fi
    if [ "$dry" = 1 ]; then
        echo "setup.sh: dry run: would install Debian packages:$missing"
    else
        echo "setup.sh: installing Debian packages:$missing"
        $sudo apt-get update -q
    fi
    # apt's plan, simulated first: it may add packages, never remove one (on Proxmox VE, Debian's
    # QEMU packages would take proxmox-ve, pve-qemu-kvm and qemu-server away); the install itself
    # runs with --no-remove too
    plan=$(apt_simulate install --no-install-recommends $missing 2>&1) || {
        printf '%s\n' "$plan" | grep '^E:' >&2
        echo "setup.sh: apt cannot install:$missing" >&2
        exit 1
    }
    removed=$(printf '%s\n' "$plan" | awk '$1 == "Remv" { printf " %s", $2 }')
    if [ -n "$removed" ]; then
        echo "setup.sh: not installing:$missing: apt would remove$removed" >&2
        exit 1
    fi
    if [ "$dry" = 1 ]; then
        echo "setup.sh: dry run: apt plans to install$(printf '%s\n' "$plan" | awk '$1 == "Inst" { printf " %s", $2 }') and to remove nothing"
    else
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-remove --no-install-recommends $missing
        installed=$(installed_list)
    fi
elif [ "$dry" = 1 ]; then
    echo "setup.sh: dry run: nothing to install"
fi
say_qemu
[ "$dry" = 0 ] || exit 0

# libvirt runs QEMU as its own user. Debian's udev rule gives /dev/kvm to group kvm (0660); where a
# host left it root-only, libvirt re-probes QEMU on every domain start (about 50 s each).
if [ -c /dev/kvm ] && [ "$(stat -c %G:%a /dev/kvm)" = "root:600" ] && getent group kvm >/dev/null; then
    if ${sudo:-} chgrp kvm /dev/kvm && ${sudo:-} chmod 0660 /dev/kvm; then
        echo "setup.sh: /dev/kvm set to root:kvm 0660 (Debian's default) so libvirt's QEMU can open it"
    fi
fi

# libvirtd: systemd starts it where systemd runs; elsewhere (containers) start it by hand.
if command -v virsh >/dev/null && ! virsh -c qemu:///system -q version >/dev/null 2>&1; then
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
    # The tests' Debian 12 guest image ([guest] image) and fio.exe, built once into the cache the tests read
    # (a few minutes), so the timed test suite finds them; the tests build them where they are missing.
    .venv/bin/python -m iomatrix.testing.debianimage \
        || echo "setup.sh: the tests' Debian 12 guest image was not built (above); the own-guest tests build it when they run" >&2
else
    .venv/bin/uv sync -q --frozen --inexact --compile-bytecode --python .venv/bin/python
fi
echo "setup.sh: ready: .venv/bin/iomatrix"
