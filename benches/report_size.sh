#!/usr/bin/env bash
# The HTML report at the study's shape: a run planned into 2,075 batches whose run.db is then
# given ~2,200 job attempts as the rehearsal makes them (every batch done, ~5 % cancelled and
# retried, a few failed, one at its walltime, two queues, 16 hosts), without running any job.
# Prints the page's size, `report --html`'s time, and headless Chromium's time to load it and
# the page's own script time (`data-render-ms`).
#
#   usage: benches/report_size.sh BIN      env: BATCHES=2075 WORK=/var/tmp/embedfleet-report-size
#   needs: python3, chromium (Debian's package)
set -euo pipefail
BIN=$(realpath "${1:?usage: benches/report_size.sh BIN}")
BATCHES=${BATCHES:-2075}
WORK=${WORK:-/var/tmp/embedfleet-report-size}
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
"$BIN" sample-corpus --papers $((BATCHES * 4)) --mean-chars 300 --seed 7 --out corpus.jsonl.gz >/dev/null 2>&1
"$BIN" plan --corpus corpus.jsonl.gz --run-dir run --papers-per-job 4 >/dev/null 2>&1
python3 - run/run.db <<'PY'
import random, sqlite3, sys
random.seed(2075)
db = sqlite3.connect(sys.argv[1])
iso = lambda t: __import__("time").strftime("%Y-%m-%dT%H:%M:%S", __import__("time").gmtime(t)) + ".%03dZ" % int(t * 1000 % 1000)
batches = [r[0] for r in db.execute("SELECT id FROM batches ORDER BY id")]
t, row = 1.8e9, 0
for b in batches:
    tries = ["cancelled"] if random.random() < 0.05 else []
    tries += ["failed"] if random.random() < 0.01 else []
    tries += ["timeout"] if b == 200 else []
    for attempt, state in enumerate(tries + ["completed"], 1):
        row += 1
        queue = random.choice(["debug", "gpu"])
        host = "node%02d" % random.randint(1, 16)
        sub = t + row * 0.25
        start = sub + random.expovariate(1 / 20)
        end = start + random.uniform(20, 40)
        name = "ef-run-b%d-a%d" % (b, attempt)
        reason = None if state == "completed" else ("failed (exit code 1)" if state == "failed" else state)
        db.execute("""INSERT INTO jobs (batch_id, attempt, backend, queue, scheduler_id, state, exit_reason,
                      submitted_at, started_at, finished_at, name, log, updated_at)
                      VALUES (?, ?, 'slurm', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                   (b, attempt, queue, str(100000 + row), state, reason, iso(sub), iso(start), iso(end),
                    name, "logs/%s.log" % name, iso(end)))
        ok = state == "completed"
        db.execute("""INSERT INTO batch_runs (batch_id, started_at, finished_at, devices, state, error,
                      model_load_s, io_s, tokenize_s, inference_s, total_s, papers, tokens, job)
                      VALUES (?, ?, ?, 'cuda:0', ?, ?, 3.1, 0.4, 0.2, ?, ?, 4, 2400, ?)""",
                   (b, iso(start + 0.5), iso(end - 0.5), "done" if ok else "failed", None if ok else state,
                    end - start - 4.7, end - start - 1, name))
        db.execute("""INSERT INTO attempts (batch_id, token, state, job, host, reason, ingested_at)
                      VALUES (?, ?, ?, ?, ?, '', ?)""",
                   (b, "t%d" % row, "accepted" if ok else "failed", name, host, iso(end)))
    db.execute("UPDATE batches SET state = 'done' WHERE id = ?", (b,))
db.commit()
print("attempts", row)
PY
start=$(date +%s.%N)
"$BIN" report --run-dir run --html report.html --trace trace.tsv 2>/dev/null
report_s=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }")
bytes=$(stat -c %s report.html)
start=$(date +%s.%N)
chromium --headless --no-sandbox --disable-gpu --user-data-dir="$WORK/profile" --virtual-time-budget=20000 \
  --dump-dom "file://$WORK/report.html" > dom.html 2>/dev/null
load_s=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }")
bars=$(grep -o '<g class="bar"' dom.html | wc -l)
script_ms=$(grep -o 'data-render-ms="[0-9.]*"' dom.html | grep -o '[0-9.]*')
echo "batches $BATCHES; attempts $(($(wc -l < trace.tsv) - 1)); bars drawn $bars"
echo "report.html: $bytes bytes ($(awk "BEGIN { printf \"%.2f\", $bytes / 1048576 }") MiB); report --html --trace: ${report_s} s"
echo "chromium --dump-dom (start, load, scripts, exit): ${load_s} s; the page's script: ${script_ms} ms"
