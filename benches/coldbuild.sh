#!/usr/bin/env bash
# Cold test builds of commits, one after the other, each in a fresh clone and an empty target
# directory: wall time, target size, and each test binary's size and first test.
#   bash benches/coldbuild.sh REV [REV ...]
set -u
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
for rev in "$@"; do
  clone=/var/tmp/cold-$rev target=/var/tmp/cold-target-$rev
  rm -rf "$clone" "$target"
  git clone -q "$repo" "$clone" && git -C "$clone" checkout -q "$rev"
  start=$(date +%s)
  (cd "$clone" && CARGO_TARGET_DIR=$target CARGO_INCREMENTAL=0 cargo nextest run --workspace --no-run >/dev/null 2>&1)
  rc=$?
  echo "$rev rc=$rc build_s=$(( $(date +%s) - start )) target_bytes=$(du -sb "$target" | cut -f1)"
  for b in "$target"/debug/deps/it-* "$target"/debug/deps/e2e-*; do
    [ -x "$b" ] && [ -f "$b" ] || continue
    echo "  $(stat -c %s "$b") $(basename "$b"): $("$b" --list 2>/dev/null | head -1)"
  done
  rm -rf "$clone" "$target"
done
