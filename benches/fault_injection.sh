#!/usr/bin/env bash
# Fault injection: ROUNDS runs of `embedfleet run` on one corpus, each SIGKILLed (the owner and
# every job and upload worker of the run, as a node crash would) at a seeded random moment,
# then one run to the end. Checks rows in shards = points in the collection = good papers,
# no id twice, and every recorded shard's sha256; prints what each round was doing when killed.
# With a second binary (the landed main), also times one unkilled run of each, alternating, for
# the wall-time overhead of the result manifests.
#
#   usage: benches/fault_injection.sh BIN [BASELINE_BIN]
#   env:   ROUNDS=20 PAPERS=2000 SEED=2026 WORK=/tmp/embedfleet-faults TIMINGS=3
set -euo pipefail
BIN=$(realpath "$1")
BASE=${2:+$(realpath "$2")}
ROUNDS=${ROUNDS:-20}
PAPERS=${PAPERS:-2000}
SEED=${SEED:-2026}
TIMINGS=${TIMINGS:-3}
WORK=${WORK:-/tmp/embedfleet-faults}
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"

"$BIN" sample-corpus --papers "$PAPERS" --mean-chars 1500 --out corpus.jsonl.gz >/dev/null
run_args=(run --corpus corpus.jsonl.gz --papers-per-job 250 --local-jobs 2 --shard-papers 50)

# Kills everything of run directory $1: the owner, its local jobs and upload workers (each in
# its own process group, so by what they run on).
kill_run() {
  local pattern="$1/jobs/|--run-dir (\S*/)?$1( |$)"
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

# What the run directory shows of the moment of the kill (read from files only: opening
# run.db would ingest).
phase_of() {
  local d=$1
  if [ ! -f "$d/plan.json" ]; then echo plan; return; fi
  local done_manifests total
  total=$(python3 -c "import json;print(len(json.load(open('$d/plan.json'))['batches']))")
  done_manifests=$(grep -l '"complete": true' "$d"/results/b*/*.json 2>/dev/null | wc -l || true)
  if [ -d "$d/qdrant" ]; then echo upload; elif [ "$done_manifests" -ge "$total" ]; then echo "ingest/upload"; else echo "embed ($done_manifests/$total batches)"; fi
}

echo "== reference: one unkilled run"
ref_s=$(timed_run "$BIN" ref)
echo "unkilled run: $ref_s s"

echo "== $ROUNDS killed rounds (seed $SEED)"
delays=$(python3 -c "
import random; r = random.Random($SEED)
print(' '.join(f'{r.uniform(0.05, 1.0) * $ref_s:.2f}' for _ in range($ROUNDS)))")
i=0
for d in $delays; do
  i=$((i + 1))
  "$BIN" "${run_args[@]}" --run-dir killed >/dev/null 2>>killed.log &
  sleep "$d"
  phase=$(phase_of killed)
  kill_run killed
  wait || true
  printf 'round %2d: killed after %6.2f s, in %s\n' "$i" "$d" "$phase"
done

echo "== final run"
"$BIN" "${run_args[@]}" --run-dir killed >final.out 2>final.err || { cat final.err; exit 1; }
points=$(grep -o 'the collection holds [0-9]* points' final.err | grep -o '[0-9]*' | tail -1)
"$BIN" status --run-dir killed --json >status.json
python3 - "$points" <<'EOF'
import json, sqlite3, sys, hashlib, pyarrow.parquet as pq
points = int(sys.argv[1])
s = json.load(open("status.json"))
failed = s["quarantined_by_reason"].get("embed_failed", 0)
good = s["papers_planned"] - failed
db = sqlite3.connect("killed/run.db")
ids, rows = [], 0
for path, n, sha in db.execute("SELECT path, rows, sha256 FROM shards"):
    f = "killed/" + path
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == sha, f
    t = pq.read_table(f, columns=["id"])
    assert t.num_rows == n, f
    ids += t.column("id").to_pylist()
    rows += n
dups = len(ids) - len(set(ids))
print(f"good papers {good}, rows in shards {rows}, points in the collection {points}, "
      f"duplicate ids {dups}, attempts {s['attempts_by_state']}")
assert rows == good == points == s["rows_in_shards"], "counts differ"
assert dups == 0
print("OK: rows in shards = points = good papers, no duplicates, every shard's sha256 verified")
EOF

if [ -n "$BASE" ]; then
  echo "== wall time of an unkilled run, this build vs the baseline, alternating ($TIMINGS each)"
  for k in $(seq "$TIMINGS"); do
    a=$(timed_run "$BIN" "new$k"); b=$(timed_run "$BASE" "base$k")
    echo "pair $k: this build $a s, baseline $b s"
    echo "$a $b" >>pairs.txt
  done
  python3 -c "
import statistics as st
p = [tuple(map(float, l.split())) for l in open('pairs.txt')]
a, b = [x for x, _ in p], [y for _, y in p]
print(f'median: this build {st.median(a):.2f} s, baseline {st.median(b):.2f} s, ratio {st.median(a)/st.median(b):.3f}')"
fi
