#!/usr/bin/env bash
# Installs the plugin under a prefix with the names NCCL looks for:
#   PREFIX/lib/libnccl-net-fabric.so   NCCL_NET_PLUGIN=fabric (with PREFIX/lib on LD_LIBRARY_PATH)
#   PREFIX/lib/libnccl-net.so          the default name, and the SONAME LD_PRELOAD needs
#   PREFIX/bin/nccl-net-fabric         doctor / demo
# Usage: scripts/install.sh [PREFIX]   (default /usr/local); builds in release mode first.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
cargo build --release --quiet
install -d "$prefix/lib" "$prefix/bin"
install -m 0755 target/release/libnccl_net_fabric.so "$prefix/lib/libnccl-net-fabric.so"
ln -sf libnccl-net-fabric.so "$prefix/lib/libnccl-net.so"
install -m 0755 target/release/nccl-net-fabric "$prefix/bin/nccl-net-fabric"
echo "installed: $prefix/lib/libnccl-net-fabric.so, $prefix/lib/libnccl-net.so, $prefix/bin/nccl-net-fabric"
