#!/usr/bin/env bash
# Runs the whole test suite, as CI does: installs what it needs (Debian packages, libfabric
# 2.1 built from source into target/), then runs every test against Debian's libfabric 1.17
# and again against the built 2.1, plus the format and lint checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "test.sh: cargo not found: install a Rust toolchain (1.80 or newer), e.g. with rustup" >&2
  exit 1
fi
bash scripts/setup-debian.sh
prefix=$(bash scripts/build-libfabric.sh)

echo "== format and lint"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== tests against libfabric $(pkg-config --modversion libfabric) (system)"
cargo test

echo "== tests against libfabric 2.1 ($prefix)"
# With the ucx provider built in, its tests must run (tests/datapath.rs, ucx_expected).
if FI_UCX_DEVICES=lo LD_LIBRARY_PATH=$prefix/lib "$prefix/bin/fi_info" -p ucx >/dev/null 2>&1; then
  export NFAB_UCX=1
fi
LIBFABRIC_DIR=$prefix CARGO_TARGET_DIR=target/libfabric-2.1-build cargo test
