#!/usr/bin/env bash
# Prepares, on the Debian build machine, what scripts/gpu/run.sh needs on a GPU machine that
# has no Rust, no libfabric and no libtool:
#   .scratch/gpu-in/plugin/      the plugin and nccl-net-fabric, built against libfabric 2.1
#   .scratch/gpu-in/libfabric-2.1.0-autogen.tar.xz   libfabric's source with ./autogen.sh run
#                                                    (in fabtests/ too)
# nccl-tests is not made here: put a copy of NVIDIA/nccl-tests in .scratch/gpu-in/nccl-tests
# (git-ignored, never committed); the nccltests stage of scripts/gpu/run.sh builds it there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.scratch/gpu-in
mkdir -p "$out/plugin"

prefix=$(bash scripts/build-libfabric.sh)
LIBFABRIC_DIR=$prefix CARGO_TARGET_DIR=target/libfabric-2.1-build cargo build --release --quiet
cp target/libfabric-2.1-build/release/libnccl_net_fabric.so \
   target/libfabric-2.1-build/release/nccl-net-fabric "$out/plugin/"

tree=$(mktemp -d)
mkdir -p "$tree/libfabric-2.1.0"
tar -xJf target/libfabric-src/libfabric_2.1.0.orig.tar.xz -C "$tree/libfabric-2.1.0" --strip-components=1
(cd "$tree/libfabric-2.1.0" && ./autogen.sh >/dev/null 2>&1)
(cd "$tree/libfabric-2.1.0/fabtests" && ./autogen.sh >/dev/null 2>&1)
tar -cJf "$out/libfabric-2.1.0-autogen.tar.xz" -C "$tree" libfabric-2.1.0
rm -rf "$tree"
echo "prepared $out (carry it to the GPU machine and run scripts/gpu/run.sh there)"
