#!/usr/bin/env bash
# Installs the plugin under a prefix with the names NCCL looks for:
#   PREFIX/lib/libnccl-net-fabric.so   NCCL_NET_PLUGIN=fabric (with PREFIX/lib on LD_LIBRARY_PATH)
#   PREFIX/lib/libnccl-net.so          the default name, and the SONAME LD_PRELOAD needs
#   PREFIX/bin/nccl-net-fabric         doctor / demo (finds PREFIX/lib/libnccl-net-fabric.so)
# Usage: scripts/install.sh [PREFIX]   (default /usr/local); builds in release mode first,
# against Debian's libfabric, or the one under LIBFABRIC_DIR (then in a target directory of
# its own unless CARGO_TARGET_DIR says otherwise), and says which libfabric the installed
# library was built against and which it will load.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
if [ -n "${LIBFABRIC_DIR:-}" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="target/libfabric-$(basename "$LIBFABRIC_DIR")-build"
fi
target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet
install -d "$prefix/lib" "$prefix/bin"
install -m 0755 "$target/release/libnccl_net_fabric.so" "$prefix/lib/libnccl-net-fabric.so"
ln -sf libnccl-net-fabric.so "$prefix/lib/libnccl-net.so"
install -m 0755 "$target/release/nccl-net-fabric" "$prefix/bin/nccl-net-fabric"
echo "installed: $prefix/lib/libnccl-net-fabric.so, $prefix/lib/libnccl-net.so, $prefix/bin/nccl-net-fabric"
loads=$(ldd "$prefix/lib/libnccl-net-fabric.so" | awk '/libfabric/ {print $3}')
report=$("$prefix/bin/nccl-net-fabric" doctor --json 2>/dev/null || true)
field() { echo "$report" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
echo "libfabric: built against $(field libfabric_headers) (headers); loads ${loads:-nothing (ldd found no libfabric)}, version $(field libfabric_runtime)"
