#!/usr/bin/env bash
# Installs what building and testing nccl-net-fabric needs on a Debian 12 machine:
# libfabric 1.17 (headers, library, fi_info), libclang for bindgen, iproute2 and util-linux
# for the tests' hosts (network namespaces joined by veth pairs), and the autotools
# that build libfabric 2.1 from source (scripts/build-libfabric.sh), with its ucx provider
# against Debian's UCX (libucx-dev), and python3 for the GPU driver's dry run.
# Safe to run again: apt-get skips what is already installed.
set -euo pipefail

packages=(
  build-essential pkg-config
  libfabric-dev libfabric-bin
  libclang-dev clang
  autoconf automake libtool make xz-utils
  dpkg-dev ca-certificates
  valgrind util-linux iproute2
  libucx-dev
  python3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
log=${TMPDIR:-/tmp}/nccl-net-fabric-setup-debian.log
echo "setup-debian: installing ${missing[*]} (apt's output: $log)"
if ! { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
      --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "setup-debian: apt-get failed (full output in $log)" >&2
  exit 1
fi
