#!/usr/bin/env bash
# The query workload's search throughput (`tune --queries`) and recall against latency
# (`eval`), unfiltered and at ~1 % selectivity, on a synthetic run of POINTS × DIM unit vectors
# loaded into the embedded engine with the default HNSW (m 16, ef_construct 100):
#   bash benches/query_eval.sh [POINTS] [DIM] [QUERIES]
set -euo pipefail
cd "$(dirname "$0")/.."
points=${1:-20000} dim=${2:-2560} queries=${3:-200}
target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p embedfleet
cargo build --release --quiet -p embedfleet-vectordb --example synthetic_run
bin=$target/release/embedfleet
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$target/release/examples/synthetic_run" "$dir/run" "$points" "$dim" 1000
start=$(date +%s.%N)
"$bin" upload --run-dir "$dir/run" --collection bench
echo "upload + index: $(echo "$(date +%s.%N) - $start" | bc) s"
"$bin" tune --queries --run-dir "$dir/run" --collection bench
# year=2003 and source=arxiv: 1/25 × 1/3 of the synthetic papers, ~1.3 %.
"$bin" eval --run-dir "$dir/run" --collection bench --sample "$queries" \
  --ef 16,32,64,128,256 --filter year=2003 --filter source=arxiv
