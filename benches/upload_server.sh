#!/usr/bin/env bash
# `embedfleet upload` against a Qdrant server, beside its two peers measured in the same sitting
# on the same server and the same points (BENCHMARKS.md, "Server figures"):
#   1. server-bound: the points as requests built before the clock starts, K in flight
#      (jobs/examples/server_bound.rs), i.e. what the server takes with nothing else to do;
#   2. embedfleet upload (parquet read, conversion, retries, checkpoints in run.db);
#   3. the Python qdrant-client's upload_collection at its best settings (benches/qdrant_python.py).
#
#   bash benches/upload_server.sh URL [POINTS] [DIM] [BATCH] [IN_FLIGHT] [PY_BATCH]
#
# Needs a running Qdrant (gRPC URL, e.g. http://127.0.0.1:6334), Python with qdrant-client,
# pyarrow and numpy. Builds with the dev profile unless PROFILE=release.
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:?usage: upload_server.sh URL [POINTS] [DIM] [BATCH] [IN_FLIGHT] [PY_BATCH]}
points=${2:-10000} dim=${3:-2560} batch=${4:-64} in_flight=${5:-4} py_batch=${6:-128}
profile=${PROFILE:-dev}
dir=$(mktemp -d /tmp/embedfleet-upload-server.XXXXXX)
trap 'rm -rf "$dir"' EXIT

cargo build --profile "$profile" --quiet --bin embedfleet -p embedfleet
cargo build --profile "$profile" --quiet -p embedfleet-jobs --example synthetic_run --example server_bound
out=${CARGO_TARGET_DIR:-target}/$([ "$profile" = dev ] && echo debug || echo "$profile")
"$out/examples/synthetic_run" "$dir/run" "$points" "$dim" 2>/dev/null

echo "== $points points of $dim-d, server $url, profile $profile"
"$out/examples/server_bound" "$dir/run" "$url" "$batch" "$in_flight"
"$out/embedfleet" upload --run-dir "$dir/run" --qdrant "$url" --collection embedfleet_bench \
  --batch-size "$batch" --in-flight "$in_flight" --workers 1 2>&1 | tail -6
python3 benches/qdrant_python.py "$dir/run" "$url" "$py_batch" 1
