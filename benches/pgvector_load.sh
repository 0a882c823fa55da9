#!/usr/bin/env bash
# The load before the index, against the floor sending could reach (issue 52: at least 0.8x):
#
#   [UPLOAD_ARGS="--batch-size 2048"] bash benches/pgvector_load.sh RUN_DIR [ROUNDS]   # ROUNDS 2
#
# In one run, on the rows of RUN_DIR (`synthetic_run` writes one), each round, in turns of
# order (upload first, then plain first, so that neither always meets a warmer server):
#   - `upload --postgres` into a fresh table (`--pg-index ivfflat`: its build is quick and
#     not measured): the upload's own "points sent in" figure, which counts from the first
#     batch to the last acknowledged one made durable (its COPY into the session's staging
#     table, the `INSERT … ON CONFLICT` and the final checkpoint);
#   - psql's plain `\copy … FROM … (FORMAT binary)` of the same rows, exported once to a file,
#     into a table of the same columns and B-tree indexes: connect, copy, commit.
# Needs EMBEDFLEET_PG_URL and PGPASSFILE (`.ci/pgvector/start-local-pg.sh` prints them) and a
# built binary ($CARGO_TARGET_DIR/debug/embedfleet, or $EMBEDFLEET_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:?usage: benches/pgvector_load.sh RUN_DIR [ROUNDS]} rounds=${2:-2}
target=${CARGO_TARGET_DIR:-target}
bin=${EMBEDFLEET_BIN:-$target/debug/embedfleet}
: "${EMBEDFLEET_PG_URL:?set EMBEDFLEET_PG_URL (and PGPASSFILE): .ci/pgvector/start-local-pg.sh prints them}"
url=$EMBEDFLEET_PG_URL
copy=${COPY_FILE:-$run/rows.copy}
psql_() { psql "$url" -v ON_ERROR_STOP=1 -qAt "$@"; }
now() { date +%s.%N; }

upload() {
  psql_ -c "DROP TABLE IF EXISTS bench_load_up"
  # shellcheck disable=SC2086 # UPLOAD_ARGS: more options, split on spaces
  "$bin" upload --run-dir "$run" --postgres "$url" --collection bench_load_up --pg-index ivfflat ${UPLOAD_ARGS:-} \
    2>&1 | grep -E "points sent in" | sed -E 's/.*: ([0-9]+) points sent in ([0-9.]+) s \(([0-9]+) points\/s.*/upload --postgres: \1 rows in \2 s, \3 rows\/s/'
}

plain() {
  if [ ! -s "$copy" ]; then
    psql_ -c "\\copy (SELECT id, paper_id, embedding, year, source, n_chars, n_tokens FROM bench_load_up) TO '$copy' (FORMAT binary)"
  fi
  local dim rows t
  dim=$(psql_ -c "SELECT vector_dims(embedding) FROM bench_load_up LIMIT 1")
  rows=$(psql_ -c "SELECT count(*) FROM bench_load_up")
  psql_ -c "DROP TABLE IF EXISTS bench_load_plain"
  psql_ -c "CREATE TABLE bench_load_plain (id uuid PRIMARY KEY, paper_id text NOT NULL, embedding vector($dim) NOT NULL, year integer, source text, n_chars integer, n_tokens integer); CREATE INDEX ON bench_load_plain (year); CREATE INDEX ON bench_load_plain (source)"
  t=$(now)
  psql_ -c "\\copy bench_load_plain FROM '$copy' (FORMAT binary)"
  t=$(echo "$(now) - $t" | bc)
  echo "plain COPY FROM STDIN (FORMAT binary): $rows rows in $t s, $(echo "$rows / $t" | bc) rows/s"
}

upload | sed "s/^/warm-up (its table is the one the file is exported from), /"
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then plain; upload; else upload; plain; fi
done
psql_ -c "DROP TABLE IF EXISTS bench_load_up, bench_load_plain"
