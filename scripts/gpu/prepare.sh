#!/usr/bin/env bash
# Prepares, on the Debian build machine, what scripts/gpu/run.py needs on a GPU machine that
# has no Rust, no libfabric and no libtool:
#   .scratch/gpu-in/plugin/      the plugin and nccl-net-fabric, built against libfabric 2.1
#   .scratch/gpu-in/libfabric-2.1.0-autogen.tar.xz   libfabric's source with ./autogen.sh run
#                                                    (in fabtests/ too)
#   .scratch/gpu-in/perf.tar.xz  this machine's perf with the libraries it loads (glibc's aside),
#                                for the threads stage on GPU machines without perf (if installed)
#   .scratch/gpu-in/tc.tar.xz    the same of tc, for the capped stage, and ip.tar.xz of ip,
#                                for the scale stage
#   .scratch/gpu-in/scale/       tests/scale.rs built for release, with the plugin beside it
# nccl-tests is not made here: put a copy of NVIDIA/nccl-tests in .scratch/gpu-in/nccl-tests
# (git-ignored, never committed); the nccltests stage of scripts/gpu/run.py builds it there.
# Likewise for the steps stage: ext-profiler/example of NVIDIA/nccl as
# .scratch/gpu-in/nccl-profiler.tar.xz (e.g. git archive --prefix=nccl-profiler/
# v2.28.9-1:ext-profiler/example | xz >…).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.scratch/gpu-in
mkdir -p "$out/plugin"

prefix=$(bash scripts/build-libfabric.sh)
LIBFABRIC_DIR=$prefix CARGO_TARGET_DIR=target/libfabric-2.1-build cargo build --release --quiet
cp target/libfabric-2.1-build/release/libnccl_net_fabric.so \
   target/libfabric-2.1-build/release/nccl-net-fabric "$out/plugin/"
mkdir -p "$out/scale"
scale=$(LIBFABRIC_DIR=$prefix CARGO_TARGET_DIR=target/libfabric-2.1-build \
  cargo test --release --test scale --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("target", {}).get("name") == "scale" and m.get("executable"):
        print(m["executable"])')
cp "$scale" "$out/scale/scale"
cp target/libfabric-2.1-build/release/libnccl_net_fabric.so "$out/scale/"

tree=$(mktemp -d)
mkdir -p "$tree/libfabric-2.1.0"
tar -xJf target/libfabric-src/libfabric_2.1.0.orig.tar.xz -C "$tree/libfabric-2.1.0" --strip-components=1
(cd "$tree/libfabric-2.1.0" && ./autogen.sh >/dev/null 2>&1)
(cd "$tree/libfabric-2.1.0/fabtests" && ./autogen.sh >/dev/null 2>&1)
tar -cJf "$out/libfabric-2.1.0-autogen.tar.xz" -C "$tree" libfabric-2.1.0
rm -rf "$tree"

# bundle TOOL: this machine's TOOL with the libraries it loads (glibc's aside), as
# $out/TOOL.tar.xz (TOOL/bin, TOOL/lib), for GPU machines that have none.
bundle() {
  command -v "$1" >/dev/null || return 0
  local tree lib
  tree=$(mktemp -d)
  mkdir -p "$tree/$1/bin" "$tree/$1/lib"
  cp "$(command -v "$1")" "$tree/$1/bin/"
  for lib in $(ldd "$(command -v "$1")" | awk '$3 ~ /^\// {print $3}'); do
    case $(basename "$lib") in
      libc.so* | libm.so* | ld-linux* | libpthread* | libdl* | librt*) ;;
      *) cp -L "$lib" "$tree/$1/lib/" ;;
    esac
  done
  tar -cJf "$out/$1.tar.xz" -C "$tree" "$1"
  rm -rf "$tree"
}
bundle perf
bundle tc
bundle ip
echo "prepared $out (carry it to the GPU machine and run python3 scripts/gpu/run.py there)"
