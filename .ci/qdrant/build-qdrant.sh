#!/usr/bin/env bash
# Builds a Qdrant server from source, offline apart from the package registries, for the tests and
# benchmarks that need a real server (no registry ships the server binary).
#
#   QDRANT_GIT=<git dir of qdrant/qdrant>  RAFT_GIT=<git dir of tikv/raft-rs> \
#   TONIC_GIT=<git dir of qdrant/tonic>  [TAG=v1.18.3] [PROFILE=perf] [OUT=/var/tmp/qdrant-$TAG] \
#   [TARGET=<cargo target dir, shared between tags to reuse their common dependencies>] \
#   bash build-qdrant.sh
#
# PROFILE=perf (the default here) is Qdrant's own profile for performance testing: opt-level 3
# without fat LTO, much faster to build; PROFILE=release is what Qdrant ships (fat LTO, one
# codegen unit: a long single-threaded link).
#
# The three git dirs are what the fetch tool brings (a bare repo is fine). Qdrant's Cargo.toml
# patches tonic with its own fork (a branch of qdrant/tonic) and takes raft-rs from git; neither is
# on crates.io. This script takes tonic from crates.io at the version Qdrant pins, applies the
# fork's one commit (Endpoint::http2_max_local_error_reset_streams) and points both at local
# paths, and installs the Rust toolchain Qdrant's `rust-version` asks for when the default is older. Needs protobuf-compiler, clang, libclang-dev, cmake (apt). About 37 min on 2 idle cores with PROFILE=release.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
: "${QDRANT_GIT:?git dir of qdrant/qdrant}" "${RAFT_GIT:?git dir of tikv/raft-rs}" "${TONIC_GIT:?git dir of qdrant/tonic}"
TAG=${TAG:-v1.18.3}
PROFILE=${PROFILE:-perf}
OUT=${OUT:-/var/tmp/qdrant-${TAG#v}}
WORK=${WORK:-/var/tmp/qdrant-build-${TAG#v}}
command -v protoc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler clang libclang-dev cmake >/dev/null
mkdir -p "$WORK"
[ -d "$WORK/src" ] || git clone -q "$QDRANT_GIT" "$WORK/src"
git -C "$WORK/src" checkout -q "$TAG"
tonic_version=$(grep -m1 -E '^tonic = \{ version = "' "$WORK/src/Cargo.toml" | sed -E 's/.*version = "([^"]+)".*/\1/')
# tonic from crates.io at Qdrant's version, through a throwaway project's `cargo fetch`
mkdir -p "$WORK/fetch/src"
printf '[package]\nname = "fetch"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\ntonic = "=%s"\n' "$tonic_version" > "$WORK/fetch/Cargo.toml"
echo 'fn main() {}' > "$WORK/fetch/src/main.rs"
(cd "$WORK/fetch" && cargo fetch -q)
src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/tonic-"$tonic_version" | head -1)
rm -rf "$WORK/tonic" && cp -r "$src" "$WORK/tonic"
# the fork's commit on top of its release commit: find it by its subject
# (git's own --grep and -n1: `git log | grep -m1` dies of SIGPIPE under pipefail once the log is long)
fork_commit=$(git -C "$TONIC_GIT" log --all -n1 --format='%H' --grep='http2_max_local_error_reset_streams')
git -C "$TONIC_GIT" diff "$fork_commit^" "$fork_commit" -- tonic/ | (cd "$WORK/tonic" && patch -p2 -s)
python3 - "$WORK/src/Cargo.toml" "$WORK/tonic" "$RAFT_GIT" <<'PY'
import re, sys
path, tonic, raft = sys.argv[1:]
s = open(path).read()
s = re.sub(r'tonic = \{ git = "https://github.com/qdrant/tonic"[^}]*\}', f'tonic = {{ path = "{tonic}" }}', s)
s = s.replace("https://github.com/tikv/raft-rs", "file://" + raft)
open(path, "w").write(s)
PY
# The Rust Qdrant asks for (1.19 needs 1.97): through rustup when the default one is older.
need=$(grep -m1 -E '^rust-version = "' "$WORK/src/Cargo.toml" | sed -E 's/.*"([^"]+)".*/\1/' || true)
have=$(rustc --version | awk '{print $2}')
if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  rustup toolchain install "$need" --profile minimal >&2
  export RUSTUP_TOOLCHAIN=$need
fi
(cd "$WORK/src" && CARGO_TARGET_DIR="${TARGET:-$WORK/target}" cargo build --profile "$PROFILE" --bin qdrant)
cp "${TARGET:-$WORK/target}/$PROFILE/qdrant" "$OUT"
echo "built $OUT ($("$OUT" --version 2>/dev/null || echo "$TAG"))"
