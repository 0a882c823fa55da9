#!/usr/bin/env bash
# PostgreSQL + pgvector beside Qdrant's embedded engine, on the same synthetic run (issue 52):
#
#   bash benches/pgvector.sh [POINTS] [DIM] [QUERIES] [TOPICS]      # 200000 768 200 2000
#
# One run of POINTS × DIM unit vectors near TOPICS topic centres, year and source by topic
# (`synthetic_run`'s CLUSTERS), then, in this order on this machine:
#   1. the same rows as a binary COPY file (exported once), loaded by psql's plain
#      `\copy ... FROM ... (FORMAT binary)` into a table of the same columns and B-tree indexes:
#      the rows/s sending could at best reach (the baseline);
#   2. `upload --postgres` (HNSW, m 16, ef_construction 100): the COPY-into-staging + upsert
#      load, then the index build;
#   3. the same with `--pg-index ivfflat`;
#   4. `upload` into the embedded Qdrant engine (the Qdrant available here: no server binary
#      is built on this machine), HNSW m 16 ef_construct 100;
#   5. `eval --compare-postgres`: each at the least effort reaching recall@10 0.95, unfiltered
#      and under the three filters, with pgvector's defaults beside (no iterative scan);
#   6. the same comparison of the IVFFlat table against the HNSW one.
#
# The load's rows/s against the plain COPY, in turns of order and several rounds, is
# benches/pgvector_load.sh's (BENCHMARKS.md quotes that one).
#
# Needs EMBEDFLEET_PG_URL and PGPASSFILE (`.ci/pgvector/start-local-pg.sh` prints them) and a
# built binary ($CARGO_TARGET_DIR/debug/embedfleet, or $EMBEDFLEET_BIN). Writes everything
# under $OUT (default: a temporary directory, kept) and prints the figures BENCHMARKS.md
# quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
points=${1:-200000} dim=${2:-768} queries=${3:-200} topics=${4:-2000}
target=${CARGO_TARGET_DIR:-target}
bin=${EMBEDFLEET_BIN:-$target/debug/embedfleet}
synthetic=${EMBEDFLEET_SYNTHETIC:-$target/debug/examples/synthetic_run}
: "${EMBEDFLEET_PG_URL:?set EMBEDFLEET_PG_URL (and PGPASSFILE): .ci/pgvector/start-local-pg.sh prints them}"
url=$EMBEDFLEET_PG_URL
out=${OUT:-$(mktemp -d /var/tmp/pgvector-bench.XXXXXX)}
mkdir -p "$out"
echo "bench directory: $out"
psql_() { psql "$url" -v ON_ERROR_STOP=1 -qAt "$@"; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

run=$out/run
if [ ! -f "$run/run.db" ]; then
  "$synthetic" "$run" "$points" "$dim" 5000 18446744073709551615 "$topics"
fi
psql_ -c "DROP TABLE IF EXISTS bench_hnsw, bench_ivf, bench_plain"

# 2. The load into PostgreSQL, HNSW (the load's two phases are in its own report).
t=$(now)
"$bin" upload --run-dir "$run" --postgres "$url" --collection bench_hnsw 2>&1 | tee "$out/upload-hnsw.txt"
echo "upload --postgres (hnsw), whole command: $(since "$t") s" | tee -a "$out/figures.txt"

# 1. The baseline: the same rows, exported as a binary COPY file, copied by psql into a table of
# the same columns and B-tree indexes (no vector index, as the load before its build).
psql_ -c "\\copy (SELECT id, paper_id, embedding, year, source, n_chars, n_tokens FROM bench_hnsw) TO '$out/rows.copy' (FORMAT binary)"
psql_ -c "CREATE TABLE bench_plain (id uuid PRIMARY KEY, paper_id text NOT NULL, embedding vector($dim) NOT NULL, year integer, source text, n_chars integer, n_tokens integer); CREATE INDEX ON bench_plain (year); CREATE INDEX ON bench_plain (source)"
t=$(now)
psql_ -c "\\copy bench_plain FROM '$out/rows.copy' (FORMAT binary)"
plain=$(since "$t")
echo "plain COPY FROM STDIN (FORMAT binary) of $points rows: $plain s, $(echo "$points / $plain" | bc) rows/s" | tee -a "$out/figures.txt"

# 3. IVFFlat.
t=$(now)
"$bin" upload --run-dir "$run" --postgres "$url" --collection bench_ivf --pg-index ivfflat 2>&1 | tee "$out/upload-ivf.txt"
echo "upload --postgres (ivfflat), whole command: $(since "$t") s" | tee -a "$out/figures.txt"

# 4. Qdrant's embedded engine.
rm -rf "$run/qdrant"
t=$(now)
"$bin" upload --run-dir "$run" --collection bench 2>&1 | tee "$out/upload-qdrant.txt"
echo "upload (qdrant embedded), whole command: $(since "$t") s" | tee -a "$out/figures.txt"

psql_ -c "SELECT c.relname, am.amname, pg_size_pretty(pg_relation_size(c.oid)) FROM pg_class c JOIN pg_am am ON am.oid = c.relam WHERE am.amname IN ('hnsw', 'ivfflat') AND c.relname LIKE 'bench%'" | tee -a "$out/figures.txt"
psql_ -c "SELECT 'table bench_hnsw', pg_size_pretty(pg_table_size('bench_hnsw'))" | tee -a "$out/figures.txt"
echo "qdrant embedded directory: $(du -sh "$run/qdrant" | cut -f1)" | tee -a "$out/figures.txt"

# 5. and 6. Side by side at the floor.
"$bin" eval --run-dir "$run" --collection bench --sample "$queries" \
  --compare-postgres "$url" --compare-table bench_hnsw | tee "$out/compare-qdrant-hnsw.md"
cp "$run/eval/compare.json" "$out/compare-qdrant-hnsw.json"
"$bin" eval --run-dir "$run" --postgres "$url" --collection bench_ivf --sample "$queries" \
  --compare-postgres "$url" --compare-table bench_hnsw | tee "$out/compare-ivf-hnsw.md"
cp "$run/eval/compare.json" "$out/compare-ivf-hnsw.json"
echo "figures: $out/figures.txt"
