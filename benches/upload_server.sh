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
# pyarrow and numpy, and curl (QDRANT_HTTP, default http://127.0.0.1:6333, to drop the
# collections). Builds with the dev profile unless PROFILE=release.
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:?usage: upload_server.sh URL [POINTS] [DIM] [BATCH] [IN_FLIGHT] [PY_BATCH]}
points=${2:-10000} dim=${3:-2560} batch=${4:-64} in_flight=${5:-4} py_batch=${6:-128}
profile=${PROFILE:-dev}
dir=$(mktemp -d /tmp/embedfleet-upload-server.XXXXXX)
trap 'rm -rf "$dir"' EXIT

cargo build --profile "$profile" --quiet --bin embedfleet -p embedfleet
cargo build --profile "$profile" --quiet -p embedfleet-vectordb --example synthetic_run --example server_bound
# WORKERS (default "1 2") lists the --workers values tried. CLIENT_CPUS (e.g. 1) pins every client to those CPUs; start the server with QDRANT_CPUS set to
# the others (.ci/qdrant/qdrant-server.sh) to model a client on its own machine.
pin=${CLIENT_CPUS:+taskset -c $CLIENT_CPUS}
out=${CARGO_TARGET_DIR:-target}/$([ "$profile" = dev ] && echo debug || echo "$profile")
"$out/examples/synthetic_run" "$dir/run" "$points" "$dim" 2>/dev/null

echo "== $points points of $dim-d, server $url, profile $profile, ${ROUNDS:-3} rounds${CLIENT_CPUS:+, clients on CPUs $CLIENT_CPUS}"
for round in $(seq 1 "${ROUNDS:-3}"); do
  echo "-- round $round"
  $pin "$out/examples/server_bound" "$dir/run" "$url" "$batch" "$in_flight"
  for workers in ${WORKERS:-1 2}; do
    $pin "$out/embedfleet" upload --run-dir "$dir/run" --qdrant "$url" --collection "bench_w${workers}_r$round" \
      --batch-size "$batch" --in-flight "$in_flight" --workers "$workers" 2>&1 |
      grep -E 'points sent|indexing took' | sed "s/^/embedfleet upload, $workers worker(s): /"
    # Dropped over REST (embedfleet has no command for it): keeps the server's memory flat.
    curl -s -o /dev/null -X DELETE "${QDRANT_HTTP:-http://127.0.0.1:6333}/collections/bench_w${workers}_r$round"
  done
  $pin python3 benches/qdrant_python.py "$dir/run" "$url" "$py_batch" 1
  $pin python3 benches/qdrant_python.py "$dir/run" "$url" "$py_batch" 2
done
