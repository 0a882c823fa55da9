#!/usr/bin/env bash
# Snapshot bulk load beside the upsert load (issue 12): one synthetic run, one server, both ways.
#
#   QDRANT_BIN=/path/to/qdrant-1.18.x [GROUP_COUNTS="default 2 4 8"] [SKIP_PER_BATCH=1] \
#     benches/snapshot_load.sh POINTS [DIM] [BATCH_POINTS]
#
# 1. upsert:   `embedfleet upload` (bulk mode) into collection `upsert`, until green: wall, and the
#              CPU seconds of the server and of the client;
# 2. build:    `embedfleet build-shard` for each batch, one process after another (on a cluster
#              each runs on its own embed node): wall and CPU seconds per batch and in all;
# 3. snapshot: `embedfleet upload --mode snapshot --no-build` into collection `snapshot`, until
#              green: wall, and the CPU seconds of the server and of the client.
# 4. groups:   for each G of GROUP_COUNTS (issue 26), a copy of the run: `build-shard --accepted
#              --group-count G` of each group, one process after another (on a cluster each is a
#              CPU job of its own), then `upload --mode snapshot --no-build` into collection `gG`:
#              build wall (sum and largest group), load wall and server CPU to green.
#              `default` is the load's own choice of G (no --group-count; it builds the groups
#              itself, so its load wall includes the builds).
# Then the collections are compared (counts; exact top-10 of 50 queries), searched (p50/p95,
# recall@10 of 200 queries at the collections' defaults), and one JSON line per phase goes to
# stdout. Step 3's collection (`snapshot`) is a key per batch, as before groups. The server is started fresh in cluster mode under $WORK/qdrant and
# stopped at the end. BIN is a release embedfleet (default $CARGO_TARGET_DIR/release/embedfleet).
# The run: `embedfleet plan` of a one-paper corpus for its run.db, then POINTS random unit
# vectors written by pyarrow (its defaults: snappy) in shards of 500 rows, BATCH_POINTS a batch,
# recorded in run.db with their sha256 — parquet made the way users make it, not by embedfleet.
# SKIP_PER_BATCH=1 leaves out steps 2 and 3 (a key per batch), already measured at a size, to
# fit the grouped loads beside the upsert in one run on a small machine.
set -euo pipefail
points=${1:?usage: snapshot_load.sh POINTS [DIM] [BATCH_POINTS]}
dim=${2:-2560}
batch=${3:-4000}
target=${CARGO_TARGET_DIR:-target}
bin=${BIN:-$target/release/embedfleet}
work=${WORK:-/var/tmp/embedfleet-snapbench-$points}
here=$(cd "$(dirname "$0")/.." && pwd)
export QDRANT_HOME=$work/qdrant QDRANT_CLUSTER=1
grpc=http://127.0.0.1:${QDRANT_GRPC_PORT:-6334}
rest=http://127.0.0.1:${QDRANT_HTTP_PORT:-6333}
tck=$(getconf CLK_TCK)

"$here/.ci/qdrant/qdrant-server.sh" stop 2>/dev/null || true
rm -rf "$work" && mkdir -p "$work"
"$bin" sample-corpus --papers 1 --out "$work/c.jsonl.gz" >&2
"$bin" plan --corpus "$work/c.jsonl.gz" --run-dir "$work/run" >&2
python3 - "$work/run" "$points" "$dim" "$batch" <<'PY'
import hashlib, os, sqlite3, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
run, n, dim, per_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
db = sqlite3.connect(f"{run}/run.db")
db.executescript("DELETE FROM papers; DELETE FROM shards; DELETE FROM batches;")
os.makedirs(f"{run}/shards", exist_ok=True)
for b, bfirst in enumerate(range(0, n, per_batch), start=1):
    brows = min(per_batch, n - bfirst)
    db.execute("INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars, state) VALUES (?, 1, ?, 'synthetic', ?, 1, 'done')", (b, b - 1, brows))
    for part, first in enumerate(range(bfirst, bfirst + brows, 500)):
        rows = min(500, bfirst + brows - first)
        v = rng.standard_normal((rows, dim), dtype=np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        ids = [f"W{i:010d}" for i in range(first, first + rows)]
        t = pa.table({"id": ids,
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel(), pa.float32()), dim),
                      "n_chars": pa.array([20000] * rows, pa.int32()), "n_tokens": pa.array([5000] * rows, pa.int32()),
                      "n_chunks": pa.array([1] * rows, pa.int16()),
                      "source": ["arxiv" if i % 3 == 0 else "s2orc" for i in range(first, first + rows)],
                      "created": [f"{2000 + i % 25}-05-02T00:00:00.000Z" for i in range(first, first + rows)]})
        rel = f"shards/b{b:06d}-{part:04d}.pyarrow.parquet"
        pq.write_table(t, f"{run}/{rel}")
        sha = hashlib.sha256(open(f"{run}/{rel}", "rb").read()).hexdigest()
        db.execute("INSERT INTO shards (batch_id, part, path, rows, sha256, created_at) VALUES (?, ?, ?, ?, ?, 'now')", (b, part, rel, rows, sha))
        for i, pid in enumerate(ids):
            db.execute("INSERT INTO papers (id, batch_id, row, line, n_chars) VALUES (?, ?, ?, ?, 20000)", (pid, b, first - bfirst + i, first + i + 1))
db.commit()
PY
batches=$(( (points + batch - 1) / batch ))
"$here/.ci/qdrant/qdrant-server.sh" start >&2
trap '"$here/.ci/qdrant/qdrant-server.sh" stop' EXIT
pid=$(cat "$QDRANT_HOME/qdrant.pid")

server_cpu() { awk -v t="$tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$pid/stat"; }
now() { date +%s.%N; }
# Runs a command under /usr/bin/time; prints "WALL CPU RSS" (user + system CPU seconds,
# children included; the peak resident set in MiB).
timed() {
  /usr/bin/time -f '%e %U %S %M' -o "$work/time" "$@" >&2
  awk '{ printf "%.2f %.2f %.0f\n", $1, $2 + $3, $4 / 1024 }' "$work/time"
}

# 1. Upsert, then the server's indexing, until green (the upload waits for green itself).
c0=$(server_cpu)
read -r up_wall up_client _ < <(timed "$bin" upload --run-dir "$work/run" --qdrant "$grpc" --collection upsert)
c1=$(server_cpu)
echo "{\"phase\":\"upsert+index\",\"points\":$points,\"dim\":$dim,\"wall_s\":$up_wall,\"client_cpu_s\":$up_client,\"server_cpu_s\":$(echo "$c1 - $c0" | bc | awk '{ printf "%.2f", $1 }')}"

per_batch=()
if [ -z "${SKIP_PER_BATCH:-}" ]; then
# 2. Each batch's shard built offline, one process per batch (one embed node each on a cluster).
build_wall=0; build_cpu=0; build_max=0
for b in $(seq 1 "$batches"); do
  read -r w c _ < <(timed "$bin" build-shard --run-dir "$work/run" --batch "$b" --accepted)
  build_wall=$(echo "$build_wall + $w" | bc | awk '{ printf "%.2f", $1 }'); build_cpu=$(echo "$build_cpu + $c" | bc | awk '{ printf "%.2f", $1 }')
  build_max=$(echo "if ($w > $build_max) $w else $build_max" | bc | awk '{ printf "%.2f", $1 }')
done
echo "{\"phase\":\"build-shard\",\"batches\":$batches,\"batch_points\":$batch,\"wall_s_sum\":$build_wall,\"wall_s_max_batch\":$build_max,\"cpu_s_sum\":$build_cpu}"

# 3. Every built shard recovered on the server, until green.
c0=$(server_cpu)
read -r sn_wall sn_client _ < <(timed "$bin" upload --run-dir "$work/run" --qdrant "$grpc" --qdrant-rest "$rest" --collection snapshot --mode snapshot --no-build --group-count "$batches")
c1=$(server_cpu)
echo "{\"phase\":\"recover+green\",\"points\":$points,\"wall_s\":$sn_wall,\"client_cpu_s\":$sn_client,\"server_cpu_s\":$(echo "$c1 - $c0" | bc | awk '{ printf "%.2f", $1 }')}"
per_batch=(snapshot)
fi

# 4. Grouped loads: a copy of the run per G (a run's grouping is pinned once), its groups built,
# then loaded.
grouped=()
for g in ${GROUP_COUNTS:-}; do
  rm -rf "$work/run-g$g" && cp -a "$work/run" "$work/run-g$g"
  rm -rf "$work/run-g$g/snapshots"
  gb_wall=0; gb_cpu=0; gb_max=0; gb_rss=0
  if [ "$g" = default ]; then
    # The load's own choice of G (no --group-count), its groups built inside the load: the
    # load wall below includes the builds.
    c0=$(server_cpu)
    read -r gl_wall gl_client _ < <(timed "$bin" upload --run-dir "$work/run-g$g" --qdrant "$grpc" --qdrant-rest "$rest" --collection "g$g" --mode snapshot 2> >(tee "$work/gdefault.err" >&2))
    c1=$(server_cpu)
    chosen=$(python3 -c 'import json, sys; k = json.load(open(sys.argv[1])); print(-(-int(sys.argv[2]) // k["batches_per_group"]))' "$work/run-g$g/snapshots/keys.json" "$batches")
    echo "{\"phase\":\"grouped\",\"groups\":\"default\",\"chosen\":$chosen,\"why\":$(grep -m1 '^groups:' "$work/gdefault.err" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().strip()))'),\"load_wall_s_with_builds\":$gl_wall,\"client_cpu_s\":$gl_client,\"server_cpu_s\":$(echo "$c1 - $c0" | bc | awk '{ printf "%.2f", $1 }')}"
    grouped+=("g$g")
    continue
  fi
  for n in $(seq 1 "$g"); do
    read -r w c rss < <(timed "$bin" build-shard --run-dir "$work/run-g$g" --accepted --group-count "$g" --group "$n")
    gb_wall=$(echo "$gb_wall + $w" | bc | awk '{ printf "%.2f", $1 }'); gb_cpu=$(echo "$gb_cpu + $c" | bc | awk '{ printf "%.2f", $1 }')
    gb_max=$(echo "if ($w > $gb_max) $w else $gb_max" | bc | awk '{ printf "%.2f", $1 }')
    gb_rss=$(( rss > gb_rss ? rss : gb_rss ))
  done
  c0=$(server_cpu)
  read -r gl_wall gl_client _ < <(timed "$bin" upload --run-dir "$work/run-g$g" --qdrant "$grpc" --qdrant-rest "$rest" --collection "g$g" --mode snapshot --no-build --group-count "$g")
  c1=$(server_cpu)
  echo "{\"phase\":\"grouped\",\"groups\":$g,\"build_wall_s_sum\":$gb_wall,\"build_wall_s_max_group\":$gb_max,\"build_cpu_s_sum\":$gb_cpu,\"build_peak_rss_mib\":$gb_rss,\"group_points\":$(( (batches + g - 1) / g * batch )),\"load_wall_s\":$gl_wall,\"client_cpu_s\":$gl_client,\"server_cpu_s\":$(echo "$c1 - $c0" | bc | awk '{ printf "%.2f", $1 }')}"
  grouped+=("g$g")
done

# The two collections hold the same points and give the same exact answers.
python3 - "$rest" "$points" "${per_batch[@]}" "${grouped[@]}" <<'PY'
import json, sys, urllib.request
rest, points, others = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def call(method, path, body=None):
    req = urllib.request.Request(rest + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["result"]
names = ["upsert", *others]
counts = {c: call("POST", f"/collections/{c}/points/count", {"exact": True})["count"] for c in names}
info = {c: call("GET", f"/collections/{c}") for c in names}
pts = call("POST", "/collections/upsert/points/scroll", {"limit": 50, "with_vector": True})["points"]
same = {c: 0 for c in names[1:]}
for p in pts:
    q = {"query": p["vector"], "limit": 10, "params": {"exact": True}}
    a = [h["id"] for h in call("POST", "/collections/upsert/points/query", q)["points"]]
    for c in names[1:]:
        same[c] += a == [h["id"] for h in call("POST", f"/collections/{c}/points/query", q)["points"]]
print(json.dumps({"phase": "compare", "counts": counts, "expected": points,
                  "status": {c: info[c]["status"] for c in info},
                  "indexed_vectors": {c: info[c].get("indexed_vectors_count") for c in info},
                  "segments": {c: info[c].get("segments_count") for c in info},
                  "exact_top10_equal_to_upsert": {c: f"{n}/{len(pts)}" for c, n in same.items()}}))
PY

# And what the shape costs a search: HNSW top-10 latency and recall against exact search.
python3 "$here/benches/snapshot_search.py" "$rest" 200 upsert "${per_batch[@]}" "${grouped[@]}"

# And `embedfleet eval`'s recall@10 (200 of the run's vectors, perturbed, against exact search
# over its parquet shards) at ef 128.
for c in upsert "${per_batch[@]}" "${grouped[@]}"; do
  "$bin" eval --run-dir "$work/run" --qdrant "$grpc" --collection "$c" --sample 200 --ef 128 --json \
    --plot "$work/eval-$c.png" > "$work/eval-$c.json"
  python3 - "$c" "$work/eval-$c.json" <<'PY'
import json, sys
c, path = sys.argv[1], sys.argv[2]
print(json.dumps({"phase": "eval", "collection": c, "eval": json.load(open(path))}))
PY
done
