#!/usr/bin/env bash
# Builds the CUDA release binary here (no GPU needed: .ci/cuda/build-cuda.sh), strips it and
# compresses it for the GPU machine, which has no Rust: target-gpu/embedfleet.xz, checked to fit
# the device tool's 64 MiB of carried files. Then, on the GPU machine:
#
#   run(command="bash benches/gpu-check.sh", carry=["target-gpu"], timeout_s=540)
#
#   usage: benches/gpu-pack.sh            env: COMPUTE_CAP=80 TARGET_DIR=/var/tmp/embedfleet-cuda
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR=${TARGET_DIR:-/var/tmp/embedfleet-cuda}
start=$(date +%s)
TARGET_DIR=$TARGET_DIR bash .ci/cuda/build-cuda.sh -p embedfleet
built=$(date +%s)
mkdir -p target-gpu
strip -o target-gpu/embedfleet "$TARGET_DIR/release/embedfleet"
xz -9 -T0 -f -k target-gpu/embedfleet
rm target-gpu/embedfleet
size=$(stat -c %s target-gpu/embedfleet.xz)
unstripped=$(stat -c %s "$TARGET_DIR/release/embedfleet")
echo "CUDA build: $((built - start)) s; binary $((unstripped / 1048576)) MiB, stripped and xz -9: $((size / 1048576)) MiB (target-gpu/embedfleet.xz)"
limit=$((64 * 1048576))
if [ "$size" -ge "$limit" ]; then
  echo "target-gpu/embedfleet.xz is over the 64 MiB the device tool carries" >&2
  exit 1
fi
