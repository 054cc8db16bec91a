#!/usr/bin/env bash
# Builds the plugin and shows it at work: the provider report (which libfabric provider NCCL
# would use, whether GPU buffers would be used, and why), then a loopback transfer through
# the exported NCCL table. Installs what it needs on Debian 12 first.
# Extra arguments go to `nccl-net-fabric demo` (e.g. --plugin PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "demo.sh: cargo not found: install a Rust toolchain (1.80 or newer), e.g. with rustup" >&2
  exit 1
fi
bash scripts/setup-debian.sh
cargo build --release --quiet
bin=target/release/nccl-net-fabric

# Loopback only: the lo interface for tcp, and shm.
export NCCL_FABRIC_DOMAINS=${NCCL_FABRIC_DOMAINS:-lo,shm}
echo "== nccl-net-fabric doctor"
"$bin" doctor || true
echo
echo "== nccl-net-fabric demo"
"$bin" demo "$@"
