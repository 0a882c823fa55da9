#!/usr/bin/env bash
# Builds the CUDA release binaries here (no GPU needed: .ci/cuda/build-cuda.sh), strips and
# compresses them for the GPU machine, which has no Rust: target-gpu/embedfleet.xz (CUDA 13) and
# target-gpu/embedfleet-cu12.xz (CUDA 12.4, built into ${TARGET_DIR}-cu12; CUDA12=0 skips it),
# with target-gpu/build.json (the build's identity: git commit, each binary's sha256, CUDA
# version, sizes), checked to fit the device tool's 64 MiB together with the working tree that
# travels with them. Then, on the GPU machine:
#
#   run(command="bash benches/gpu-check.sh", carry=["target-gpu"], timeout_s=600)
#
#   usage: benches/gpu-pack.sh
#   env:   COMPUTE_CAP=80 TARGET_DIR=/var/tmp/embedfleet-cuda CUDA12=1 (0: the CUDA 13 binary only)
#          CUDA12_HOME (a CUDA 12 toolkit of your own; else assembled: .ci/cuda/cuda12-toolkit.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR=${TARGET_DIR:-/var/tmp/embedfleet-cuda}
CUDA12=${CUDA12:-1}
limit=$((64 * 1048576))
mkdir -p target-gpu
rm -f target-gpu/build.json target-gpu/embedfleet target-gpu/embedfleet-cu12

entries=()
pack() { # BINARY DEST.xz CUDA BUILD_SECONDS: stripped, xz -9, and its line of build.json
  local bin=$1 dest=$2 cuda=$3 secs=$4 size unstripped stripped sha
  # The symbol table stays (2 MiB more after xz): a backtrace from the GPU machine names its
  # functions. Only the line tables go.
  strip --strip-debug -o "${dest%.xz}" "$bin"
  stripped=$(stat -c %s "${dest%.xz}")
  sha=$(sha256sum "${dest%.xz}" | cut -d' ' -f1)
  xz -9 -T0 -f "${dest%.xz}"
  size=$(stat -c %s "$dest")
  unstripped=$(stat -c %s "$bin")
  echo "binary $((unstripped / 1048576)) MiB, stripped $((stripped / 1048576)) MiB, xz -9: $((size / 1048576)) MiB ($dest, sha256 ${sha:0:16} of the stripped binary)"
  entries+=("$(printf '"%s": {"cuda": "%s", "sha256": "%s", "bytes": %s, "stripped_bytes": %s, "xz_bytes": %s, "build_s": %s}' \
    "$(basename "$dest")" "$cuda" "$sha" "$unstripped" "$stripped" "$size" "$secs")")
}

start=$(date +%s)
TARGET_DIR=$TARGET_DIR bash .ci/cuda/build-cuda.sh -p embedfleet
secs=$(($(date +%s) - start))
echo "CUDA 13 build: $secs s"
pack "$TARGET_DIR/release/embedfleet" target-gpu/embedfleet.xz 13.0 "$secs"

if [ "$CUDA12" = 1 ]; then
  start=$(date +%s)
  CUDA_MAJOR=12 TARGET_DIR=${TARGET_DIR}-cu12 bash .ci/cuda/build-cuda.sh -p embedfleet | tee target-gpu/.build-cu12.log
  secs=$(($(date +%s) - start))
  echo "CUDA 12 build: $secs s"
  # build-cuda.sh's last line: "built with CUDA 12.4: ..."
  cuda12=$(sed -n 's/^built with CUDA \([0-9.]*\):.*/\1/p' target-gpu/.build-cu12.log)
  rm -f target-gpu/.build-cu12.log
  pack "${TARGET_DIR}-cu12/release/embedfleet" target-gpu/embedfleet-cu12.xz "${cuda12:-12}" "$secs"
else
  rm -f target-gpu/embedfleet-cu12.xz # a stale one would be checked as if it were this build's
fi

# The identity gpu-check.sh puts into its report (and checks the unpacked binaries against).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=false
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=true
{
  printf '{"git_commit": "%s", "git_dirty": %s, "packed_at": "%s", "compute_cap": "%s", "binaries": {' \
    "$commit" "$dirty" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${COMPUTE_CAP:-80}"
  (IFS=,; printf '%s' "${entries[*]}")
  printf '}}\n'
} >target-gpu/build.json
python3 -m json.tool target-gpu/build.json >/dev/null

# What travels: the working tree (tracked and untracked-not-ignored files) and target-gpu.
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s -- 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')
carried=$(du -cb target-gpu | tail -n1 | cut -f1)
total=$((carried + tree))
echo "travels: target-gpu $((carried / 1048576)) MiB + working tree $((tree / 1024)) KiB = $((total / 1048576)) MiB of 64"
if [ "$total" -ge "$limit" ]; then
  echo "target-gpu/ and the working tree are over the 64 MiB the device tool carries" >&2
  ls -l target-gpu >&2
  exit 1
fi
