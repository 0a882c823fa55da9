#!/usr/bin/env bash
# The Qdrant server binary the server tests run against, printed as a path on stdout:
#
#   QDRANT_BIN=$(bash .ci/qdrant/unpack-qdrant.sh)
#
# - QDRANT_BIN already set (a binary of your own, e.g. a 1.19 you built with build-qdrant.sh):
#   that one, checked to run (`--version`).
# - Otherwise the Qdrant 1.18.3 kept beside the clone, `../shared/qdrant/` (read-only; its README
#   says how it was built), or QDRANT_XZ: its sha256 checked against the one below (a mismatch
#   fails, naming both sums), unpacked once into QDRANT_UNPACK_DIR (default /var/tmp), keyed by
#   that sum so that another archive never reuses a stale binary.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The sha256 of ../shared/qdrant/qdrant-1.18.3-x86_64-linux-gnu.xz, as its README gives it.
expected=2d86bdfbc96e9e69ef94b17e6bdeb0661ffe3d5d21e63ced603e97f57c0a3e16
version=1.18.3

runs() { # BIN: prints its version line, fails when it does not run
  local out
  out=$("$1" --version 2>&1) || { echo "$1 does not run: $out" >&2; return 1; }
  echo "$out" >&2
}

if [ -n "${QDRANT_BIN:-}" ]; then
  [ -x "$QDRANT_BIN" ] || { echo "QDRANT_BIN=$QDRANT_BIN is not an executable file" >&2; exit 1; }
  runs "$QDRANT_BIN"
  echo "$QDRANT_BIN"
  exit 0
fi

archive=${QDRANT_XZ:-$here/../shared/qdrant/qdrant-$version-x86_64-linux-gnu.xz}
if [ ! -f "$archive" ]; then
  echo "no Qdrant server archive at $archive: CI keeps it in ../shared/qdrant beside the clone;" \
    "elsewhere set QDRANT_BIN to a qdrant binary (docs/testing.md, \"Server tests\")" >&2
  exit 1
fi
actual=$(sha256sum "$archive" | cut -d' ' -f1)
if [ "$actual" != "$expected" ]; then
  echo "$archive has sha256 $actual, not $expected (../shared/qdrant/README.md):" \
    "refusing to run it" >&2
  exit 1
fi
bin=${QDRANT_UNPACK_DIR:-/var/tmp}/embedfleet-qdrant-$version-${expected:0:12}
if [ ! -x "$bin" ] || ! runs "$bin"; then
  # Unpacked beside its final name, then renamed: a run killed mid-unpack leaves no half binary.
  xz -dc "$archive" >"$bin.tmp.$$"
  chmod +x "$bin.tmp.$$"
  mv "$bin.tmp.$$" "$bin"
  runs "$bin"
fi
echo "$bin"
