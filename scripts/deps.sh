#!/usr/bin/env bash
# Installs the Debian packages weenv's build, tests, demo and benchmark need.
# The one place where the package list lives: .ci/run and scripts/demo.sh source this file.
# Needs root (or sudo). Skips `apt-get update` when everything is already installed.
set -euo pipefail

WEENV_APT_PACKAGES=(
  protobuf-compiler libprotobuf-dev  # protoc + well-known .protos: build.rs of containerd-client and of weenv-snapshotter (generated Snapshots server)
  fuse3               # fusermount3 for the snapshotter's FUSE mounts
  containerd runc     # stock containerd + runc for end-to-end tests
  umoci busybox-static skopeo   # offline test images, OCI layout <-> registry copies
  docker-registry     # private OCI registry (distribution 2.8)
  zstd                # round-trip checks with the reference zstd tool
  debootstrap debian-archive-keyring gpgv  # Debian rootfs test image from the apt mirror
  iproute2
  qemu-system-x86 e2fsprogs  # scripts/vm-cgroup2.sh: the cgroup v2 test VM (TCG), its disks built with mke2fs -d / read with debugfs
  stargz-snapshotter  # ctr-remote: eStargz comparison in the benchmark
  golang-go golang-github-containerd-containerd-dev  # integration/go/stockrun: containerd's Go client (nerdctl's calls), GOPATH mode, offline
  python3 pkg-config gcc ca-certificates curl openssl
  libseccomp-dev iptables  # scripts/go-tools.sh: runc with seccomp (cgo); the CNI portmap plugin
)

weenv_install_deps() {
  local missing=() p sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then sudo=(sudo -n); else
      echo "deps.sh: need root (or sudo) to install packages" >&2; return 1; fi
  fi
  for p in "${WEENV_APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "deps.sh: all ${#WEENV_APT_PACKAGES[@]} packages already installed"
  else
    echo "deps.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
  fi
  # Kernel modules used by the tests; best effort (built in on some kernels, absent in some VMs).
  "${sudo[@]}" modprobe fuse 2>/dev/null || true
  "${sudo[@]}" modprobe overlay 2>/dev/null || true
  # rustup's default location, for shells that did not source ~/.cargo/env (CI runners, sudo).
  if ! command -v cargo >/dev/null && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null; then
    echo "deps.sh: cargo not found on PATH; install a Rust toolchain (rustup, >= 1.89) with rustfmt and clippy" >&2
    return 1
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  weenv_install_deps
fi
