#!/usr/bin/env bash
# Builds libfabric 2.1.0 from Debian trixie's source tarball into a prefix inside the
# build tree (default: target/libfabric-2.1), and prints that prefix on stdout.
# With UCX's headers installed (Debian's libucx-dev) the ucx provider is built too.
# The result is cached: a second run with the prefix in place and the same configure flags
# does nothing.
#
# The Debian mirror is the one this machine's own apt sources already use; the system's
# apt configuration is not changed (a private sources list and list directory are used).
#
# Environment:
#   LIBFABRIC_PREFIX   where to install (default: <repo>/target/libfabric-2.1)
#   LIBFABRIC_CONFIGURE_EXTRA  extra ./configure flags (e.g. --with-cuda=/usr/local/cuda --enable-cuda-dlopen)
#   LIBFABRIC_TARBALL  build from this tarball instead of downloading Debian's source: the
#                      orig tarball, or a source tree already prepared with ./autogen.sh (for
#                      machines without autotools)
set -euo pipefail

version=2.1.0
sha256=1a66369772d5bb151737214af1c478993e969cf298e8f9ed369e7a2ab8d8c6df
repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${LIBFABRIC_PREFIX:-$repo/target/libfabric-2.1}
work=$repo/target/libfabric-src
# The ucx provider where UCX is installed, unless the extra flags name it themselves.
ucx_flag=""
if [ -f /usr/include/ucp/api/ucp.h ] && [[ "${LIBFABRIC_CONFIGURE_EXTRA:-}" != *ucx* ]]; then
  ucx_flag=--enable-ucx
fi
flags="--enable-only --enable-tcp --enable-rxm --enable-shm --enable-udp --enable-rxd --enable-sm2 $ucx_flag --disable-static ${LIBFABRIC_CONFIGURE_EXTRA:-}"
stamp=$prefix/.built-$version-$(echo "$flags" | sha1sum | cut -c1-8)

log() { echo "build-libfabric: $*" >&2; }

if [ -f "$stamp" ] && [ -e "$prefix/lib/libfabric.so" ]; then
  log "cached at $prefix"
  echo "$prefix"
  exit 0
fi

mkdir -p "$work"
tarball=${LIBFABRIC_TARBALL:-$work/libfabric_$version.orig.tar.xz}

if [ -n "${LIBFABRIC_TARBALL:-}" ]; then
  [ -f "$tarball" ] || { log "LIBFABRIC_TARBALL=$tarball does not exist"; exit 1; }
elif [ ! -f "$tarball" ] || ! echo "$sha256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
  # The Debian mirror named by this machine's apt sources (deb822 or one-line format).
  mirror=$(grep -rhoE '(URIs:|^deb)[[:space:]]+[^[:space:]]+/debian/?([[:space:]]|$)' \
             /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
           | awk '{print $2}' | sed 's:/*$::' | head -n1 || true)
  if [ -z "$mirror" ]; then
    log "no Debian mirror found in /etc/apt/sources.list*; set LIBFABRIC_TARBALL to a downloaded libfabric_$version.orig.tar.xz"
    exit 1
  fi
  aptdir=$work/apt
  mkdir -p "$aptdir/lists/partial"
  echo "deb-src $mirror trixie main" > "$aptdir/sources.list"
  opts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$aptdir/lists" -o "Debug::NoLocking=1")
  log "fetching libfabric $version source from trixie (apt's output: $work/apt.log)"
  apt-get "${opts[@]}" update -q >"$work/apt.log" 2>&1 \
    || { tail -n 20 "$work/apt.log" >&2; log "apt-get update failed"; exit 1; }
  # The .dsc and .debian.tar.xz may be missing on the mirror (apt then reports 404s, and
  # that it downloads unsandboxed as root): the orig tarball is all that is needed.
  (cd "$work" && apt-get "${opts[@]}" source --download-only libfabric >>"$work/apt.log" 2>&1) || true
  if [ ! -f "$work/libfabric_$version.orig.tar.xz" ]; then
    tail -n 20 "$work/apt.log" >&2
    log "apt-get source did not deliver libfabric_$version.orig.tar.xz"
    exit 1
  fi
  tarball=$work/libfabric_$version.orig.tar.xz
  echo "$sha256  $tarball" | sha256sum -c --quiet - || { log "checksum mismatch for $tarball"; exit 1; }
fi

src=$work/libfabric-$version
rm -rf "$src"
mkdir -p "$src"
tar -xJf "$tarball" -C "$src" --strip-components=1
cd "$src"
log "autogen + configure + make (a minute or two)"
if [ ! -x configure ]; then
  ./autogen.sh >"$work/autogen.log" 2>&1 || { tail -n 30 "$work/autogen.log" >&2; exit 1; }
fi
# shellcheck disable=SC2086
./configure --prefix="$prefix" $flags >"$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
make -j"$(nproc)" install >"$work/make.log" 2>&1 || { tail -n 30 "$work/make.log" >&2; exit 1; }
touch "$stamp"
log "installed at $prefix"
echo "$prefix"
