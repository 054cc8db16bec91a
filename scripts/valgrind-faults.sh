#!/usr/bin/env bash
# Runs the fault tests (tests/faults.rs) and the hostile-input tests (tests/hostile.rs: the
# corpus of damaged handles and control messages, a stranger's injections and floods) with
# every child process under valgrind memcheck, against Debian's libfabric 1.17 and the built
# 2.1, and fails if valgrind saw an invalid read or write with a frame of the plugin on its
# stack. Logs: target/valgrind/<version>/.
#
# Slow (valgrind runs the children 20-50 times slower; their deadlines are stretched by
# NFAB_SLOW). Arguments are passed to the test binaries, e.g. a test name to run just that,
# VERSIONS picks the libfabric versions (default "1.17 2.1") and TESTS the test files
# (default "faults hostile"):
#   VERSIONS=2.1 bash scripts/valgrind-faults.sh a_truncated_receive_fails_alone
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-debian.sh >/dev/null
command -v valgrind >/dev/null || {
  echo "valgrind-faults: valgrind not found (scripts/setup-debian.sh installs it)" >&2
  exit 1
}
prefix=$(bash scripts/build-libfabric.sh)

run() { # label, then env assignments for cargo
  local label=$1; shift
  local logs=$PWD/target/valgrind/$label
  rm -rf "$logs"; mkdir -p "$logs"
  local t
  for t in ${TESTS:-faults hostile}; do
    echo "== $t tests under valgrind, libfabric $label (logs in $logs)"
    # Peers under valgrind answer probes late: a longer liveness timeout keeps them alive.
    env "$@" NFAB_VALGRIND_DIR="$logs" NFAB_SLOW=30 NCCL_FABRIC_PEER_TIMEOUT_MS=20000 \
      cargo test --quiet --test "$t" -- --test-threads=1 "${ARGS[@]}"
  done
  python3 scripts/valgrind-check.py "$logs"
}

# Builds of their own: a rebuild in the usual target folders during the (long) run would
# replace the binaries under valgrind's feet.
ARGS=("$@")
for v in ${VERSIONS:-1.17 2.1}; do
  case $v in
    1.17) run 1.17 LIBFABRIC_DIR= CARGO_TARGET_DIR=target/valgrind-build/1.17 ;;
    2.1) run 2.1 LIBFABRIC_DIR="$prefix" CARGO_TARGET_DIR=target/valgrind-build/2.1 ;;
    *) echo "valgrind-faults: unknown libfabric version $v (1.17 or 2.1)" >&2; exit 2 ;;
  esac
done
