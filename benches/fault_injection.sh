#!/usr/bin/env bash
# Fault injection: ROUNDS trials of `embedfleet run` on one corpus, each in a fresh run
# directory, SIGKILLed (the owner and every job of the run, as a node crash would) at a seeded
# random moment of its run — or, every fifth trial, inside an ingest transaction
# (EMBEDFLEET_TEST_KILL_AT=ingest) — then run again to the end. After each: rows in shards =
# points in the collection = good papers, no id twice, every recorded shard's sha256 verified.
# Then the faults of a cluster's run state (issue 21), FAULT_ROUNDS trials each, killed at a
# seeded moment first: run.db deleted (the rerun must refuse; with results/ and shards/ moved
# away as it says, exact), 3 papers deleted between uploads (exact less the 3), and a result
# manifest unreadable for one poll (exact). With a second binary (the landed main), also times
# unkilled runs of each, alternating, for the wall-time overhead of the result manifests.
#
#   usage: benches/fault_injection.sh BIN [BASELINE_BIN]
#   env:   ROUNDS=20 FAULT_ROUNDS=2 PAPERS=2000 MEAN_CHARS=200 SEED=2026
#          WORK=/tmp/embedfleet-faults TIMINGS=3
set -euo pipefail
BIN=$(realpath "$1")
BASE=${2:+$(realpath "$2")}
ROUNDS=${ROUNDS:-20}
FAULT_ROUNDS=${FAULT_ROUNDS:-2}
PAPERS=${PAPERS:-2000}
MEAN_CHARS=${MEAN_CHARS:-200}
SEED=${SEED:-2026}
TIMINGS=${TIMINGS:-3}
WORK=${WORK:-/tmp/embedfleet-faults}
# Nothing of an earlier invocation may still run on these directories.
pkill -KILL -f -- "$WORK/" 2>/dev/null || true
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"

"$BIN" sample-corpus --papers "$PAPERS" --mean-chars "$MEAN_CHARS" --out corpus.jsonl.gz >/dev/null
run_args=(run --corpus "$WORK/corpus.jsonl.gz" --papers-per-job 250 --local-jobs 2 --shard-papers 50)

# Kills everything of run directory $1 (absolute): the owner, its local jobs and their scripts.
kill_run() {
  local pattern="$1(/| |$)"
  pkill -KILL -f -- "$pattern" || true
  while pgrep -f -- "$pattern" >/dev/null; do sleep 0.05; done
}

timed_run() { # BIN DIR -> seconds of one unkilled run
  local start end
  start=$(date +%s.%N)
  "$1" "${run_args[@]}" --run-dir "$2" >/dev/null 2>"$2.log"
  end=$(date +%s.%N)
  python3 -c "print(round($end - $start, 2))"
}

# What the run directory shows of the moment of the kill (files only: opening run.db ingests).
phase_of() {
  local d=$1 total done_manifests
  if [ ! -f "$d/plan.json" ]; then echo plan; return; fi
  total=$(python3 -c "import json;print(len(json.load(open('$d/plan.json'))['batches']))")
  done_manifests=$(grep -l '"complete": true' "$d"/results/b*/*.json 2>/dev/null | wc -l || true)
  if [ -d "$d/qdrant" ]; then echo upload
  elif [ "$done_manifests" -ge "$total" ]; then echo "ingest"
  else echo "embed ($done_manifests/$total batches)"; fi
}

# Checks run directory $1 after its final run ($2: that run's stderr; $3: papers deleted).
check() {
  local d=$1 points
  points=$(grep -o 'the collection holds [0-9]* points' "$2" | grep -o '[0-9]*' | tail -1 || true)
  "$BIN" status --run-dir "$d" --json >"$d.status.json"
  python3 - "$d" "${points:-0}" "${3:-0}" <<'EOF'
import json, sqlite3, sys, hashlib, pyarrow.parquet as pq
run, points, deleted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(run + ".status.json"))
good = s["papers_planned"] - s["quarantined_by_reason"].get("embed_failed", 0)
ids, rows = [], 0
for path, n, sha in sqlite3.connect(run + "/run.db").execute("SELECT path, rows, sha256 FROM shards"):
    f = run + "/" + path
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == sha, f
    t = pq.read_table(f, columns=["id"])
    assert t.num_rows == n, f
    ids += t.column("id").to_pylist()
    rows += n
dups = len(ids) - len(set(ids))
ok = rows == good == points + deleted == s["rows_in_shards"] and dups == 0
print(f"good {good}, rows {rows}, points {points}" + (f" (+{deleted} deleted)" if deleted else "")
      + f", duplicates {dups}, attempts {s['attempts_by_state']}: {'OK' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
}

echo "== reference: one unkilled run"
ref_s=$(timed_run "$BIN" "$WORK/ref")
echo "unkilled run: $ref_s s; $(check "$WORK/ref" "$WORK/ref.log")"

echo "== $ROUNDS trials, each killed once then run to the end (seed $SEED)"
delays=$(python3 -c "
import random; r = random.Random($SEED)
print(' '.join(f'{r.uniform(0.02, 0.98) * $ref_s:.2f}' for _ in range($ROUNDS)))")
i=0 failed=0
for d in $delays; do
  i=$((i + 1))
  dir="$WORK/t$i"
  if [ $((i % 5)) -eq 0 ]; then
    EMBEDFLEET_TEST_KILL_AT=ingest "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.killed.log" || true
    how="inside an ingest transaction (kill hook)"
    kill_run "$dir"
  else
    "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.killed.log" &
    sleep "$d"
    how="after $d s, in $(phase_of "$dir")"
    kill_run "$dir"
    wait || true
  fi
  "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.final.log" || { echo "trial $i: final run failed"; tail -5 "$dir.final.log"; }
  verdict=$(check "$dir" "$dir.final.log") || failed=$((failed + 1))
  printf 'trial %2d: killed %s; then %s\n' "$i" "$how" "$verdict"
done
echo "trials failed: $failed of $ROUNDS"

# Starts a run of $1 and SIGKILLs it after $2 seconds.
killed_run() {
  "$BIN" "${run_args[@]}" --run-dir "$1" >/dev/null 2>"$1.killed.log" &
  sleep "$2"
  kill_run "$1"
  wait || true
}

echo "== faults of run state, $FAULT_ROUNDS trials each (seed $SEED)"
fault_delays=$(python3 -c "
import random; r = random.Random($SEED + 1)
print(' '.join(f'{r.uniform(0.05, 0.6) * $ref_s:.2f}' for _ in range(3 * $FAULT_ROUNDS)))")
set -- $fault_delays
fault_failed=0
for k in $(seq "$FAULT_ROUNDS"); do
  # run.db lost: the rerun refuses; moved away as it says, the next run is exact.
  dir="$WORK/lost$k"; d=$1; shift
  killed_run "$dir" "$d"
  rm -f "$dir"/run.db "$dir"/run.db-wal "$dir"/run.db-shm
  code=0; "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.refused.log" || code=$?
  mkdir -p "$dir.away"; mv "$dir/results" "$dir/shards" "$dir.away/" 2>/dev/null || true
  "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.final.log" || echo "lost $k: final run failed"
  verdict=$(check "$dir" "$dir.final.log") || fault_failed=$((fault_failed + 1))
  [ "$code" -eq 4 ] || { verdict="$verdict; but the rerun over the old results exited $code, not 4"; fault_failed=$((fault_failed + 1)); }
  printf 'run.db lost %d: killed after %s s, deleted; rerun exited %s (4: refused); moved away, then %s\n' "$k" "$d" "$code" "$verdict"

  # 3 papers deleted between two uploads: the rest of the run and a second upload keep them out.
  dir="$WORK/delete$k"; d=$1; shift
  killed_run "$dir" "$d"
  "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.first.log" || echo "delete $k: first run failed"
  mapfile -t ids < <(python3 -c "
import sqlite3; db = sqlite3.connect('$dir/run.db')
print('\n'.join(r[0] for r in db.execute('SELECT id FROM papers WHERE duplicate_of IS NULL ORDER BY id LIMIT 3 OFFSET $((k * 7))')))")
  "$BIN" delete --run-dir "$dir" "${ids[@]}" >/dev/null 2>"$dir.delete.log" || echo "delete $k: delete failed"
  "$BIN" upload --run-dir "$dir" >/dev/null 2>"$dir.final.log" || echo "delete $k: upload failed"
  verdict=$(check "$dir" "$dir.final.log" 3) || fault_failed=$((fault_failed + 1))
  printf 'deleted between uploads %d: killed after %s s, run again, %s deleted, uploaded again: %s\n' "$k" "$d" "${ids[*]}" "$verdict"

  # A manifest that cannot be read for one poll (a directory in its place: EISDIR, as ESTALE).
  dir="$WORK/unreadable$k"; d=$1; shift
  killed_run "$dir" "$d"
  m=$(ls "$dir"/results/b*/*.json 2>/dev/null | head -1 || true)
  if [ -n "$m" ]; then mv "$m" "$m.aside"; mkdir "$m"; fi
  "$BIN" status --run-dir "$dir" >/dev/null 2>"$dir.poll.log" || echo "unreadable $k: status failed"
  if [ -n "$m" ]; then rmdir "$m"; mv "$m.aside" "$m"; fi
  "$BIN" "${run_args[@]}" --run-dir "$dir" >/dev/null 2>"$dir.final.log" || echo "unreadable $k: final run failed"
  verdict=$(check "$dir" "$dir.final.log") || fault_failed=$((fault_failed + 1))
  printf 'manifest unreadable for a poll %d: killed after %s s, %s unreadable for one status; then %s\n' "$k" "$d" "${m:+${m#"$dir/"}}" "$verdict"
done
echo "fault trials failed: $fault_failed of $((3 * FAULT_ROUNDS))"
failed=$((failed + fault_failed))

if [ -n "$BASE" ]; then
  echo "== wall time of an unkilled run, this build vs the baseline, alternating ($TIMINGS each)"
  for k in $(seq "$TIMINGS"); do
    a=$(timed_run "$BIN" "$WORK/new$k"); b=$(timed_run "$BASE" "$WORK/base$k")
    echo "pair $k: this build $a s, baseline $b s"
    echo "$a $b" >>pairs.txt
  done
  python3 -c "
import statistics as st
p = [tuple(map(float, l.split())) for l in open('pairs.txt')]
a, b = [x for x, _ in p], [y for _, y in p]
print(f'median: this build {st.median(a):.2f} s, baseline {st.median(b):.2f} s, ratio {st.median(a)/st.median(b):.3f}')"
fi
[ "$failed" -eq 0 ]
