#!/usr/bin/env bash
# Prepares, on the Debian build machine, what scripts/gpu/run.sh needs on a GPU machine that
# has no Rust, no libfabric and no libtool:
#   .scratch/gpu-in/plugin/      the plugin and nccl-net-fabric, built against libfabric 2.1
#   .scratch/gpu-in/libfabric-2.1.0-autogen.tar.xz   libfabric's source with ./autogen.sh run
#                                                    (in fabtests/ too)
#   .scratch/gpu-in/perf.tar.xz  this machine's perf with the libraries it loads (glibc's aside),
#                                for the threads stage on GPU machines without perf (if installed)
# nccl-tests is not made here: put a copy of NVIDIA/nccl-tests in .scratch/gpu-in/nccl-tests
# (git-ignored, never committed); the nccltests stage of scripts/gpu/run.sh builds it there.
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

tree=$(mktemp -d)
mkdir -p "$tree/libfabric-2.1.0"
tar -xJf target/libfabric-src/libfabric_2.1.0.orig.tar.xz -C "$tree/libfabric-2.1.0" --strip-components=1
(cd "$tree/libfabric-2.1.0" && ./autogen.sh >/dev/null 2>&1)
(cd "$tree/libfabric-2.1.0/fabtests" && ./autogen.sh >/dev/null 2>&1)
tar -cJf "$out/libfabric-2.1.0-autogen.tar.xz" -C "$tree" libfabric-2.1.0
rm -rf "$tree"

if command -v perf >/dev/null; then
  tree=$(mktemp -d)
  mkdir -p "$tree/perf/bin" "$tree/perf/lib"
  cp "$(command -v perf)" "$tree/perf/bin/"
  for lib in $(ldd "$(command -v perf)" | awk '$3 ~ /^\// {print $3}'); do
    case $(basename "$lib") in
      libc.so* | libm.so* | ld-linux* | libpthread* | libdl* | librt*) ;;
      *) cp -L "$lib" "$tree/perf/lib/" ;;
    esac
  done
  tar -cJf "$out/perf.tar.xz" -C "$tree" perf
  rm -rf "$tree"
fi
echo "prepared $out (carry it to the GPU machine and run scripts/gpu/run.sh there)"
