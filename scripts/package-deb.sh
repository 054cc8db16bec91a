#!/usr/bin/env bash
# Builds the Debian package nccl-net-fabric_<version>_<arch>.deb (with dpkg-deb) against
# Debian's libfabric, and prints its path. It installs
#   /usr/lib/<triplet>/libnccl-net-fabric.so   NCCL_NET_PLUGIN=fabric
#   /usr/lib/<triplet>/libnccl-net.so          the default name NCCL tries, and LD_PRELOAD's
#   /usr/bin/nccl-net-fabric                   doctor [--selftest] / demo / settings
#   /usr/share/doc/nccl-net-fabric/            README.md, docs/, copyright
# and depends on the libfabric1 it was built against (that version or newer).
# Usage: scripts/package-deb.sh [OUTDIR]   (default target/debian)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${LIBFABRIC_DIR:-}" ]; then
  echo "package-deb: the package depends on Debian's libfabric1; unset LIBFABRIC_DIR" >&2
  exit 1
fi
out=${1:-target/debian}
target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu")
fabric=$(dpkg-query -W -f='${Version}' libfabric1)
fabric_upstream=${fabric#*:}
fabric_upstream=${fabric_upstream%%-*}
libc=$(dpkg-query -W -f='${Version}' libc6)

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
install -d "$root/DEBIAN" "$root/usr/lib/$triplet" "$root/usr/bin" "$root/usr/share/doc/nccl-net-fabric"
install -m 0644 "$target/release/libnccl_net_fabric.so" "$root/usr/lib/$triplet/libnccl-net-fabric.so"
ln -s libnccl-net-fabric.so "$root/usr/lib/$triplet/libnccl-net.so"
install -m 0755 "$target/release/nccl-net-fabric" "$root/usr/bin/nccl-net-fabric"
install -m 0644 README.md "$root/usr/share/doc/nccl-net-fabric/README.md"
install -d "$root/usr/share/doc/nccl-net-fabric/docs"
install -m 0644 docs/*.md "$root/usr/share/doc/nccl-net-fabric/docs/"
license=$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)
printf 'nccl-net-fabric\nLicense: %s\n' "$license" >"$root/usr/share/doc/nccl-net-fabric/copyright"
size=$(du -sk "$root/usr" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: nccl-net-fabric
Version: $version
Architecture: $arch
Maintainer: nccl-net-fabric developers <nccl-net-fabric@localhost>
Installed-Size: $size
Depends: libfabric1 (>= $fabric_upstream), libc6 (>= ${libc%%-*})
Section: libs
Priority: optional
Description: NCCL network plugin over libfabric
 Carries NCCL's inter-node traffic over a libfabric provider (tcp;ofi_rxm, shm, ...)
 and says which provider it picked and why. Load it with NCCL_NET_PLUGIN=fabric;
 check it with nccl-net-fabric doctor --selftest.
CONTROL
mkdir -p "$out"
deb=$out/nccl-net-fabric_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
