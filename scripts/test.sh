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
# The GPU driver (scripts/gpu/run.py): what it reads back out of nccl-tests logs, then every
# stage's commands, printed without a GPU.
python3 -m unittest discover -s scripts/gpu -p 'test_*.py' -q
stages=$(python3 scripts/gpu/run.py --help | sed -n '/^Stages:/,$p' | awk '/^  [a-z]/ {print $1}')
if dry=$(OUT=target/gpu-dry-run python3 scripts/gpu/run.py --dry-run $stages 2>&1) &&
  ! grep -q "stage .* failed" <<<"$dry"; then
  echo "scripts/gpu/run.py --dry-run: $(wc -w <<<"$stages") stages"
else
  echo "$dry" | tail -20 >&2
  echo "test.sh: scripts/gpu/run.py --dry-run failed" >&2
  exit 1
fi

echo "== tests against libfabric $(pkg-config --modversion libfabric) (system)"
cargo test

echo "== tests against libfabric 2.1 ($prefix)"
# With the ucx provider built in, its tests must run (tests/datapath.rs, ucx_expected).
if FI_UCX_DEVICES=lo LD_LIBRARY_PATH=$prefix/lib "$prefix/bin/fi_info" -p ucx >/dev/null 2>&1; then
  export NFAB_UCX=1
fi
LIBFABRIC_DIR=$prefix CARGO_TARGET_DIR=target/libfabric-2.1-build cargo test
