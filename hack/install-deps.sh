#!/usr/bin/env bash
# Installs the OS tools converge executes and its tests need, on Debian.
# With the argument "e2e", also what the real-kubelet suite (test/e2e) runs:
# etcd, containerd, runc, the CNI plugins, busybox for the test images and
# debootstrap for the csi-node image's Debian root, shellcheck for make
# vet, fio; with "release" (make release), debootstrap alone; with "bench"
# (make bench), fio.
# Idempotent: does nothing when every tool is present.
set -euo pipefail
# Go: the version go.mod names. A Go 1.21 or later switches to it by
# itself (GOTOOLCHAIN=auto, through the module proxy), so go env run in
# the module reports it; an older one, such as Debian 12's golang (1.19),
# cannot even read go.mod.
mod="$(dirname "$0")/../go.mod"
want="go$(sed -n 's/^go //p' "$mod")"
if ! have=$(cd "$(dirname "$mod")" && go env GOVERSION 2>/dev/null); then
  why=$(cd "$(dirname "$mod")" && { go env GOVERSION 2>&1 || true; } | tail -n1)
  have="no go that runs it ($why)"
elif [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" = "$want" ]; then
  have=
fi
if [ -n "$have" ]; then
  echo "install-deps: converge builds with Go ${want#go} (go.mod); this machine has ${have#go}." >&2
  echo "  Install it from https://go.dev/dl/ (Debian 12's golang package is 1.19), or any Go 1.21 or later, which fetches ${want#go} itself." >&2
  exit 1
fi
need=()
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v mkfs.xfs  >/dev/null || need+=(xfsprogs)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v blkid     >/dev/null || need+=(util-linux)
command -v losetup   >/dev/null || need+=(mount)
# make bench's data-path figures (test/bench BenchmarkDataPath) run fio,
# and so does the e2e's TestIOLimits, in a pod.
if [ "${1:-}" = bench ] || [ "${1:-}" = e2e ]; then
  command -v fio >/dev/null || need+=(fio)
fi
if [ "${1:-}" = release ] || [ "${1:-}" = e2e ]; then
  command -v debootstrap >/dev/null || need+=(debootstrap)
  # debootstrap checks Debian's signatures against it (test/e2e/ociimage).
  [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
fi
if [ "${1:-}" = e2e ]; then
  # actionlint (make vet) checks the workflows' run: scripts with it.
  command -v shellcheck >/dev/null || need+=(shellcheck)
  command -v etcd       >/dev/null || need+=(etcd-server)
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc       >/dev/null || need+=(runc)
  [ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
  # The static build: the test image holds nothing but it.
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${need[*]}; run as root" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || true  # a stale index still usually works
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The kernel's loop driver: /dev/loop-control appears once it is loaded.
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
