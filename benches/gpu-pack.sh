#!/usr/bin/env bash
# Builds the CUDA release binary here (no GPU needed: .ci/cuda/build-cuda.sh), strips it and
# compresses it for the GPU machine, which has no Rust: target-gpu/embedfleet.xz (CUDA 13) and,
# with CUDA12=1, target-gpu/embedfleet-cu12.xz (CUDA 12, built into ${TARGET_DIR}-cu12), checked
# to fit the device tool's 64 MiB together with the benches/ scripts. Then, on the GPU machine:
#
#   run(command="bash benches/gpu-check.sh", carry=["target-gpu"], timeout_s=420)
#
#   usage: benches/gpu-pack.sh
#   env:   COMPUTE_CAP=80 TARGET_DIR=/var/tmp/embedfleet-cuda CUDA12=1 (also the CUDA 12 binary; needs CUDA12_HOME, a CUDA 12 toolkit: see .ci/cuda/build-cuda.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR=${TARGET_DIR:-/var/tmp/embedfleet-cuda}
CUDA12=${CUDA12:-0}
limit=$((64 * 1048576))
mkdir -p target-gpu

pack() { # BINARY DEST.xz: stripped and xz -9
  local bin=$1 dest=$2 size unstripped
  strip -o "${dest%.xz}" "$bin"
  xz -9 -T0 -f "${dest%.xz}"
  size=$(stat -c %s "$dest")
  unstripped=$(stat -c %s "$bin")
  echo "binary $((unstripped / 1048576)) MiB, stripped and xz -9: $((size / 1048576)) MiB ($dest)"
}

start=$(date +%s)
TARGET_DIR=$TARGET_DIR bash .ci/cuda/build-cuda.sh -p embedfleet
echo "CUDA 13 build: $(( $(date +%s) - start )) s"
pack "$TARGET_DIR/release/embedfleet" target-gpu/embedfleet.xz

if [ "$CUDA12" = 1 ]; then
  start=$(date +%s)
  CUDA_MAJOR=12 TARGET_DIR=${TARGET_DIR}-cu12 bash .ci/cuda/build-cuda.sh -p embedfleet
  echo "CUDA 12 build: $(( $(date +%s) - start )) s"
  pack "${TARGET_DIR}-cu12/release/embedfleet" target-gpu/embedfleet-cu12.xz
else
  rm -f target-gpu/embedfleet-cu12.xz # a stale one would be checked as if it were this build's
fi

# What travels: everything under target-gpu (carried) and the scripts gpu-check.sh runs.
carried=$(du -cb target-gpu | tail -n1 | cut -f1)
scripts=$(cat benches/*.sh benches/*.py | wc -c)
total=$((carried + scripts))
echo "carried: target-gpu $((carried / 1048576)) MiB + benches/ scripts $((scripts / 1024)) KiB = $((total / 1048576)) MiB of 64"
if [ "$total" -ge "$limit" ]; then
  echo "target-gpu/ and benches/ are over the 64 MiB the device tool carries" >&2
  ls -l target-gpu >&2
  exit 1
fi
