#!/usr/bin/env bash
# Exact top-k throughput of `eval`'s brute force beside numpy on the same data, same run:
#   bash benches/exact.sh [POINTS] [QUERIES] [DIM] [K]
# Prints one JSON line per implementation and the ratio. numpy runs without the machine's
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE overrides (they slow a current numpy) and reports the
# BLAS it used.
set -euo pipefail
cd "$(dirname "$0")/.."
points=${1:-50000} queries=${2:-256} dim=${3:-2560} k=${4:-10}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo build --release --quiet -p embedfleet-query --example exact_bench
ours=$("${CARGO_TARGET_DIR:-target}/release/examples/exact_bench" "$dir" "$points" "$queries" "$dim" "$k")
echo "$ours"
peer=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 - "$dir" "$k" <<'PY'
import json, sys, time
import numpy as np
d, k = sys.argv[1], int(sys.argv[2])
x = np.load(f"{d}/points.npy"); q = np.load(f"{d}/queries.npy")
best = None
for _ in range(3):
    t = time.perf_counter()
    s = q @ x.T
    top = np.argpartition(-s, k, axis=1)[:, :k]
    order = np.take_along_axis(s, top, axis=1).argsort(axis=1)[:, ::-1]
    top = np.take_along_axis(top, order, axis=1)
    e = time.perf_counter() - t
    best = e if best is None else min(best, e)
try:
    from threadpoolctl import threadpool_info
    blas = ",".join(f"{i.get('internal_api')}:{i.get('architecture')}" for i in threadpool_info())
except Exception:
    blas = "unknown"
print(json.dumps({"impl": "numpy", "numpy": np.__version__, "blas": blas, "points": x.shape[0], "queries": q.shape[0], "dim": x.shape[1], "k": k, "secs": round(best, 4), "queries_per_s": round(q.shape[0] / best, 1), "first_query_top": [int(i) for i in top[0]]}))
PY
)
echo "$peer"
python3 - "$ours" "$peer" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
same = a["first_query_top"] == b["first_query_top"]
print(f"ratio embedfleet/numpy: {a['queries_per_s'] / b['queries_per_s']:.2f} (same top-{a['k']} for query 0: {same})")
PY
