#!/usr/bin/env bash
# A dress rehearsal of the whole product at the study's *shape* with tiny work: 2,075 batches of
# 4 short papers (8,300 papers over several gzip files and one pyarrow-written parquet file)
# through the real one-node Slurm (.ci/slurm/start-local-slurm.sh; partitions debug and gpu,
# each with a cap), or with SCHEDULER=pbs the real one-node OpenPBS (.ci/pbs/start-local-pbs.sh;
# benches/rehearsal-scheduler.sh holds each one's commands), with seeded faults, into a three-peer Qdrant cluster as grouped shards
# (`upload --mode snapshot`), then 22,723 query terms, `eval` and `publish` (the published
# folder loaded by Hugging Face `datasets`). CPU only: the tiny random Qwen3 stands for the 4B.
#
# Faults, each listed in the report with when it struck and what it hit:
#   - CANCEL_PCT % of the batches' jobs cancelled with `scancel` (`qdel`) while running;
#   - the submit loop SIGKILLed three times and started again with no options;
#   - partition (queue) DRAIN_PARTITION drained for DRAIN_S seconds;
#   - one result manifest unreadable for one poll (a directory in its place, as ESTALE);
#   - one job hung (SIGSTOP) until the scheduler kills it at its walltime (WALLTIME).
# With MEASURE=1 the third loop runs as embedfleet did before it kept its scans to the open
# work (EMBEDFLEET_FULL_SWEEP_S=0: every batch's results folder read at every poll) and the
# fourth as it does now; a window of each gives the owner's CPU and file operations per poll
# (from the loop's own counters in status-snapshot.json) and its syscalls per poll
# (`strace -c`), a ratio in one run at about the same batch count; then a third window in
# which nothing arrives (the loop paused, the run's pending jobs held, its embed-jobs stopped):
# the fourth loop's quiet rounds, what a poll costs whatever arrives (`cpu_ms_per_quiet_poll`).
#
# Paced like the study (PACE_S > 0): during each measured window every embed job sleeps PACE_S
# seconds before it embeds, so that about (running jobs) x POLL / PACE_S results arrive a poll
# (the study: 64 jobs of ~40 min, a poll every 30 s: ~0.8 a poll; here ~40 jobs of 100 s, a
# poll every 2 s); the window starts once every running job is a paced one. BEFORE_BIN runs
# the first three loops (the "before" build; the stored run config is then its own), BIN the
# fourth: before and after in one run, at about the same batch count.
#
# The end counts are checked by readers that are not ours: pyarrow (shard rows, no id twice),
# Qdrant's REST API or qdrant-edge-py (points), `datasets` (published rows); query rows must be
# terms x 10. Writes $WORK/report.json and prints a table; exits 1 when a check fails.
#
#   usage: benches/rehearsal.sh BIN
#   env:   BATCHES=2075 PAPERS_PER_BATCH=4 SHARD_PAPERS=1 QUEUES="debug=32 gpu=32" POLL=2
#          DRAIN_PARTITION=gpu (one of QUEUES)
#          CANCEL_PCT=5 DRAIN_S=120 WALLTIME=00:02:00 TERMS=22723 SEED=2075 MEAN_CHARS=300
#          PEERS=3 (0: the embedded engine) PEER_KILL=0 (1: a peer SIGKILLed mid-load, then
#          started again and the load typed again) QDRANT_BIN=/var/tmp/qdrant-1.18.3 PORT_BASE=7400
#          MEASURE=1 WORK=/var/tmp/embedfleet-rehearsal MAX_CHARS=4000
#          SCHEDULER=slurm (or pbs) PBS_NS=embedfleet-pbs
#          BEFORE_ENV, AFTER_ENV, BEFORE_LABEL, AFTER_LABEL (the measured loops; see below)
#          BEFORE_BIN=BIN PACE_S=0 JOB_MEM= (e.g. 150M: sbatch --mem) QUIET_WINDOW=1 SUBMIT_ONLY=0
#   needs: a running Slurm (.ci/slurm/start-local-slurm.sh) or PBS (.ci/pbs/start-local-pbs.sh,
#          as root: its commands run inside its namespace), python3 with pyarrow and
#          datasets (and qdrant-edge-py for PEERS=0), strace for MEASURE=1, procps, and for
#          PEERS > 0 curl and a Qdrant server binary (docs/testing.md: build-qdrant.sh).
set -uo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "${1:?usage: benches/rehearsal.sh BIN}")
BATCHES=${BATCHES:-2075}
PAPERS_PER_BATCH=${PAPERS_PER_BATCH:-4}
SHARD_PAPERS=${SHARD_PAPERS:-1}
QUEUES=${QUEUES:-debug=32 gpu=32}
DRAIN_PARTITION=${DRAIN_PARTITION:-gpu}
POLL=${POLL:-2}
CANCEL_PCT=${CANCEL_PCT:-5}
DRAIN_S=${DRAIN_S:-120}
WALLTIME=${WALLTIME:-00:02:00}
TERMS=${TERMS:-22723}
SEED=${SEED:-2075}
MEAN_CHARS=${MEAN_CHARS:-300}
PEERS=${PEERS:-3}
PEER_KILL=${PEER_KILL:-0}
QDRANT_BIN=${QDRANT_BIN:-/var/tmp/qdrant-1.18.3}
PORT_BASE=${PORT_BASE:-7400}
MEASURE=${MEASURE:-1}
WORK=${WORK:-/var/tmp/embedfleet-rehearsal}
# What the measured loops run with (MEASURE=1): by default the scans before and after issue 25;
# BEFORE_ENV=EMBEDFLEET_REPORT_EVERY_S=0 AFTER_ENV=EMBEDFLEET_REPORT_EVERY_S=10 measures the
# owner without and with its report.html (every 10 s) and metrics.prom (issue 38).
BEFORE_ENV=${BEFORE_ENV:-EMBEDFLEET_FULL_SWEEP_S=0}
AFTER_ENV=${AFTER_ENV:-}
BEFORE_LABEL=${BEFORE_LABEL:-full_sweep_every_poll}
AFTER_LABEL=${AFTER_LABEL:-open_work_only}
BEFORE_BIN=$(realpath "${BEFORE_BIN:-$BIN}")
PACE_S=${PACE_S:-0}
JOB_MEM=${JOB_MEM:-}
QUIET_WINDOW=${QUIET_WINDOW:-1}
SUBMIT_ONLY=${SUBMIT_ONLY:-0}
PAPERS=$((BATCHES * PAPERS_PER_BATCH))
RANDOM=$SEED

# shellcheck source=benches/rehearsal-scheduler.sh
. "$HERE/benches/rehearsal-scheduler.sh"
sched_up || exit 2
# Nothing of an earlier rehearsal may still run on these directories or ports.
[ -d "$WORK" ] && pkill -KILL -f -- "$WORK/" 2>/dev/null
[ -d "$WORK/qdrant" ] && QDRANT_HOME=$WORK/qdrant QDRANT_PEERS=$PEERS QDRANT_BASE_PORT=$PORT_BASE \
  bash "$HERE/.ci/qdrant/qdrant-cluster.sh" stop >/dev/null 2>&1
# Its jobs only: other runs (the test suite's) may share the cluster.
for id in $(jobs_of "$WORK"); do cancel_job "$id" || true; done
undrain_queue "$DRAIN_PARTITION" >/dev/null 2>&1 || true
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
RUN=$WORK/run
FAULTS=$WORK/faults.jsonl
: > "$FAULTS"
failed=0
T0=$(date +%s.%N)
# Arithmetic on decimals by awk (no bc on a bare machine).
calc() { awk "BEGIN { printf \"%.${2:-3}f\", $1 }"; }
since() { calc "$(date +%s.%N) - $T0" 1; }
fault() { # KIND TEXT: one line of the fault list
  printf '{"t_s": %s, "kind": "%s", "what": "%s"}\n' "$(since)" "$1" "$2" >> "$FAULTS"
  echo "[$(since) s] fault: $1: $2"
}
check() { # NAME GOT WANT
  if [ "$2" = "$3" ]; then echo "check $1: $2 = $3"; else echo "CHECK FAILED $1: $2, wanted $3"; failed=$((failed + 1)); fi
  printf '{"check": "%s", "got": "%s", "want": "%s"}\n' "$1" "$2" "$3" >> "$WORK/checks.jsonl"
}
timed() { # STAGE command...: wall and CPU (the command and its children) into stages.jsonl
  local stage=$1 code wall user sys; shift
  local TIMEFORMAT='%R %U %S' # bash's own `time`: no GNU time needed
  { time "$@" >"$WORK/$stage.out" 2>"$WORK/$stage.err"; } 2>"$WORK/$stage.time"
  code=$?
  read -r wall user sys < <(tail -n1 "$WORK/$stage.time")
  printf '{"stage": "%s", "wall_s": %.2f, "cpu_s": %.2f, "exit": %s}\n' "$stage" "$wall" "$(calc "$user + $sys" 2)" "$code" >> "$WORK/stages.jsonl"
  echo "[$(since) s] $stage: exit $code, ${wall} s"
  [ "$code" = 0 ] || { echo "  $stage failed; the end of its stderr:"; tail -n 5 "$WORK/$stage.err" | sed 's/^/    /'; failed=$((failed + 1)); }
  return "$code"
}

echo "== corpus: $PAPERS papers in peS2o's format, 4 gzip files and one parquet file written by pyarrow"
# Each file a whole number of batches (a batch never spans two files): gzip files of a multiple
# of 4 x PAPERS_PER_BATCH papers together, the parquet file the rest.
gz=$((PAPERS * 85 / 100 / (4 * PAPERS_PER_BATCH) * 4 * PAPERS_PER_BATCH))
"$BIN" sample-corpus --papers "$gz" --mean-chars "$MEAN_CHARS" --files 4 --seed "$SEED" --out corpus >/dev/null 2>&1
"$BIN" sample-corpus --papers $((PAPERS - gz)) --mean-chars "$MEAN_CHARS" --seed $((SEED + 1)) --out extra.jsonl >/dev/null 2>&1
# Short papers (the issue's "tiny work"): sample-corpus makes one paper in 500 about 200,000
# characters long, which takes the tiny model minutes on a shared core and would outlast the
# WALLTIME that ends the hung job. Each text is cut to MAX_CHARS; the files stay peS2o's format.
python3 - "$WORK" "${MAX_CHARS:-4000}" <<'PY'
import glob, gzip, json, sys, pyarrow as pa, pyarrow.parquet as pq
work, cut = sys.argv[1], int(sys.argv[2])
for f in glob.glob(f"{work}/corpus/*.jsonl.gz"):
    rows = [json.loads(l) for l in gzip.open(f, "rt")]
    with gzip.open(f, "wt") as out:
        for r in rows:
            r["text"] = r["text"][:cut]
            out.write(json.dumps(r) + "\n")
rows = [json.loads(l) for l in open(f"{work}/extra.jsonl")]
for r in rows:
    r["id"] = "pq-" + str(r["id"])  # its own ids: not duplicates of the gzip files' papers
    r["text"] = r["text"][:cut]
pq.write_table(pa.Table.from_pylist(rows), f"{work}/corpus/extra.parquet")  # pyarrow's defaults
PY
rm extra.jsonl
"$BIN" make-tiny-model --out MODEL >/dev/null 2>&1
{ config_table; cat <<TOML; } > run.toml
[scheduler.script]
embedfleet = "$BIN"
walltime = "$WALLTIME"
TOML
[ -n "$JOB_MEM" ] && echo "extra_directives = [\"#SBATCH --mem=$JOB_MEM\"]" >> run.toml
[ "$PACE_S" != 0 ] && echo "setup = [\"if [ -e $WORK/pace ]; then sleep $PACE_S; fi\"]" >> run.toml
queue_args=()
for q in $QUEUES; do queue_args+=(--queue "$q"); done

echo "== plan"
timed plan "$BIN" plan --corpus corpus --run-dir "$RUN" --papers-per-job "$PAPERS_PER_BATCH" || exit 1
planned=$("$BIN" status --run-dir "$RUN" --json | python3 -c 'import json,sys; print(sum(json.load(sys.stdin)["batches_by_state"].values()))')
check batches_planned "$planned" "$BATCHES"

# ---------------------------------------------------------------- submit, with faults
loop_pid=
loops=0
start_loop() { # [ENV=VALUE...]: the submit loop in the background; the first with its options
  loops=$((loops + 1))
  local bin=$BIN
  [ "$MEASURE" = 1 ] && [ "$loops" -lt 4 ] && bin=$BEFORE_BIN
  if [ "$loops" = 1 ]; then
    env "$@" "$bin" submit --run-dir "$RUN" --config run.toml --model-dir "$WORK/MODEL" --devices cpu \
      "${queue_args[@]}" --shard-papers "$SHARD_PAPERS" --poll-interval "$POLL" --max-attempts 4 \
      --lost-after 60 >"loop$loops.out" 2>"loop$loops.err" &
  else
    # Restarted as an operator would after a crash: no options, the run's stored ones.
    env "$@" "$bin" submit --run-dir "$RUN" >"loop$loops.out" 2>"loop$loops.err" &
  fi
  loop_pid=$!
  echo "[$(since) s] submit loop $loops started (pid $loop_pid${1:+, $*})"
}
loop_cpu_s() { # CPU seconds of process $1 so far
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0
}
loop_state() { # polls cpu_s result_file_ops pid ingest_cpu_s taken_in cpu_by_part_s (JSON) quiet_polls quiet_cpu_s of the loop, from its own counters
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["submit_loop"]; print(s.get("polls",0), s.get("cpu_s",0), s.get("result_file_ops",0), s["pid"], s.get("ingest_cpu_s",0), s.get("taken_in",0), json.dumps(s.get("cpu_by_part_s",{}), separators=(",",":")), s.get("quiet_polls",0), s.get("quiet_cpu_s",0))' \
    "$RUN/status-snapshot.json" 2>/dev/null || echo "0 0 0 0 0 0 {} 0 0"
}
measure() { # LABEL SECONDS: the loop's cost per poll over a window (its own counters), then
  # its syscalls per poll under `strace -c` for as long (polls counted by the loop again)
  local label=$1 secs=$2 pid=$loop_pid a b c
  if [ "$PACE_S" != 0 ]; then
    touch "$WORK/pace"
    sleep $((PACE_S + 4 * POLL)) # every running job a paced one
  fi
  a=$(loop_state); sleep "$secs"; b=$(loop_state)
  timeout -s INT "$secs" strace -c -p "$pid" -o "$WORK/strace-$label.txt" 2>/dev/null
  c=$(loop_state)
  rm -f "$WORK/pace"
  python3 - "$label" "$a" "$b" "$c" "$(open_jobs)" "$(done_batches)" "$WORK/strace-$label.txt" >> "$WORK/windows.jsonl" <<'PY'
import json, sys
label, a, b, c, open_jobs, done, path = sys.argv[1:8]
state = lambda s: ([float(x) for x in s.split()[:6]] + [json.loads(s.split()[6]) if len(s.split()) > 6 else {}]
                  + [float(x) for x in (s.split()[7:9] + ["0", "0"])[:2]])
(p0, c0, o0, pid0, i0, t0, parts0, q0, qc0), (p1, c1, o1, pid1, i1, t1, parts1, q1, qc1), (p2, _, _, pid2, _, _, _, _, _) = [state(s) for s in (a, b, c)]
polls, traced = p1 - p0, p2 - p1
calls = {}
for line in open(path):
    f = line.split()
    if len(f) >= 5 and f[-1].isidentifier() and f[-1] != "total" and f[3].isdigit():
        calls[f[-1]] = int(f[3])
meta = ("openat", "open", "newfstatat", "statx", "fstat", "stat", "lstat", "getdents64", "unlink",
        "unlinkat", "rename", "renameat", "renameat2", "mkdir", "access", "readlink")
per = lambda n, d: n / d if d else None
print(json.dumps({"window": label, "same_loop": pid0 == pid1 == pid2, "polls": polls,
  "cpu_ms_per_poll": per(1e3 * (c1 - c0), polls),
  # Taking in new results is per result (two a poll here, about one at the study's pace);
  # the rest of a poll is what it costs whatever arrives: the part that must not grow.
  "results_per_poll": per(t1 - t0, polls),
  "ingest_ms_per_result": per(1e3 * (i1 - i0), t1 - t0),
  "cpu_ms_per_poll_apart_from_ingest": per(1e3 * ((c1 - c0) - (i1 - i0)), polls),
  "cpu_ms_per_poll_by_part": {k: per(1e3 * (v - parts0.get(k, 0)), polls) for k, v in parts1.items()},
  # Rounds in which nothing arrived: a poll's cost whatever arrives.
  "quiet_polls": q1 - q0, "cpu_ms_per_quiet_poll": per(1e3 * (qc1 - qc0), q1 - q0),
  "result_file_ops_per_poll": per(o1 - o0, polls),
  "open_jobs": int(open_jobs), "batches_done": int(done),
  "strace_polls": traced,
  "syscalls_per_poll": per(sum(calls.values()), traced),
  "file_metadata_syscalls_per_poll": per(sum(v for k, v in calls.items() if k in meta), traced),
  "getdents64_per_poll": per(calls.get("getdents64", 0), traced),
  "openat_per_poll": per(calls.get("openat", 0), traced)}))
PY
  echo "[$(since) s] measured window $label: $(tail -n1 "$WORK/windows.jsonl")"
}
quiet_window() { # SECONDS: nothing arrives for a window — the loop paused (`embedfleet pause`),
  # the run's pending jobs held, its embed-jobs stopped (SIGSTOP; Slurm still runs them) — so
  # that its rounds cost what a poll costs whatever arrives
  local secs=$1 pending
  "$BIN" pause --run-dir "$RUN" >/dev/null 2>&1
  mapfile -t pending < <(jobs_of "$RUN" pending)
  hold_jobs "${pending[@]}"
  pkill -STOP -f -- "embed-job --run-dir $RUN "
  fault quiet "loop paused, pending jobs held, embed-jobs stopped for a cost window"
  sleep $((POLL + 1)) # the round under way ends, and what it took in
  measure quiet "$secs"
  pkill -CONT -f -- "embed-job --run-dir $RUN "
  [ -n "${hung_pid:-}" ] && kill -STOP "$hung_pid" 2>/dev/null # the hung job stays hung
  release_jobs "${pending[@]}"
  "$BIN" resume --run-dir "$RUN" >/dev/null 2>&1
}
last_status_json=$WORK/status.json
poll_status() { # status --json as a user would run it, timed (its latency goes in the report)
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" status --run-dir "$RUN" --json >"$last_status_json.new" 2>/dev/null && mv "$last_status_json.new" "$last_status_json"
  t1=$(date +%s.%N)
  calc "$t1 - $t0" >> "$WORK/status_latency.txt"; echo >> "$WORK/status_latency.txt"
}
done_batches() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["batches_by_state"].get("done",0))' "$last_status_json" 2>/dev/null || echo 0; }
# This run's jobs: their scripts are under $RUN/jobs.
open_jobs() { jobs_of "$RUN" | wc -l; }
# An embed-job of this run caught and stopped (SIGSTOP), its pid printed; the pids given are
# passed over. Looked for every 50 ms for up to 3 s: a small batch's embed-job lives well under
# a second, and one look a poll can miss them all.
stop_an_embed_job() {
  local skip=" $* " pid
  for _ in $(seq 1 60); do
    for pid in $(pgrep -f -- "embed-job --run-dir $RUN "); do
      case "$skip" in *" $pid "*) continue ;; esac
      kill -STOP "$pid" 2>/dev/null || continue
      # One that just ended (a zombie, on a loaded machine) takes the signal but has no
      # command line left: no hang, and no batch to check its timeout by. Another is taken.
      if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- '--batch [0-9]'; then
        echo "$pid" && return 0
      fi
      kill -CONT "$pid" 2>/dev/null
    done
    sleep 0.05
  done
  return 1
}
# The scheduler's id of the job an embed-job (pid) runs in.
job_of_pid() { tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n "s/^$(job_id_var)=//p"; }

echo "== submit: $BATCHES batches to ${QUEUES}, with faults"
submit_t0=$(date +%s.%N)
start_loop
cancel_target=$(( (BATCHES * CANCEL_PCT + 99) / 100 ))
measuring= hung_job= hung_pid= cancelled_pids= cancelled=0 kills=0 drained=0 drain_until=0 unreadable=0 hung=0 hung_batch= windows_started=0
total_loop_cpu=0
kill_at=(20 45 75)
while kill -0 "$loop_pid" 2>/dev/null; do
  sleep 1
  poll_status
  d=$(done_batches)
  pct=$((100 * d / BATCHES))
  # The loop SIGKILLed at 20 %, 45 % and 75 %, and started again without its options.
  # (Not while a cost window measures the loop: it would measure two.)
  if [ "$kills" -lt 3 ] && [ "$pct" -ge "${kill_at[$kills]}" ] && { [ -z "$measuring" ] || ! kill -0 "$measuring" 2>/dev/null; }; then
    total_loop_cpu=$(calc "$total_loop_cpu + $(loop_cpu_s "$loop_pid")")
    kill -KILL "$loop_pid"; wait "$loop_pid" 2>/dev/null
    kills=$((kills + 1))
    fault loop_killed "submit loop $loops (pid $loop_pid) SIGKILLed at $d of $BATCHES batches done"
    sleep 1
    if [ "$MEASURE" = 1 ] && [ "$kills" = 2 ]; then
      start_loop $BEFORE_ENV
    elif [ "$MEASURE" = 1 ] && [ "$kills" = 3 ]; then
      start_loop $AFTER_ENV
    else
      start_loop
    fi
  fi
  # Running jobs cancelled, spread over the run: CANCEL_PCT % of the batches by 75 % done.
  # The victim is caught running, not picked from a listing (a job of a few seconds, PBS
  # starting the next at once, often ended between the listing and its cancel, and a slow
  # poll then found none running at all): an embed-job stopped so that its job cannot end
  # before the cancel, its job cancelled, then continued so that it takes the scheduler's
  # signal.
  if [ "$cancelled" -lt "$cancel_target" ] && [ $((cancelled * BATCHES * 3)) -le $((cancel_target * d * 4)) ]; then
    if caught=$(stop_an_embed_job $hung_pid); then
      victim=$(job_of_pid "$caught")
      if [ -n "$victim" ] && cancel_job "$victim"; then
        cancelled=$((cancelled + 1)) cancelled_pids="$cancelled_pids $caught"
        fault "$CANCEL_KIND" "job $victim cancelled while running ($cancelled of $cancel_target)"
      fi
      kill -CONT "$caught" 2>/dev/null
    fi
  fi
  # One job hung: its embed-job stopped until the scheduler's walltime kills it (not one of
  # the cancelled jobs' embed-jobs, which are ending).
  if [ "$hung" = 0 ] && [ "$pct" -ge 10 ]; then
    if victim=$(stop_an_embed_job $cancelled_pids); then
      hung=1 hung_pid=$victim
      hung_batch=$(tr '\0' ' ' < "/proc/$victim/cmdline" | sed -n 's/.*--batch \([0-9]*\).*/\1/p')
      hung_job=$(job_of_pid "$victim")
      fault hang "embed-job pid $victim (job $hung_job, batch $hung_batch) stopped until its walltime $WALLTIME"
    fi
  fi
  # Partition DRAIN_PARTITION drained for DRAIN_S seconds.
  if [ "$drained" = 0 ] && [ "$pct" -ge 30 ]; then
    drain_queue "$DRAIN_PARTITION" && drained=1 && drain_until=$(( $(date +%s) + DRAIN_S ))
    fault drain "partition $DRAIN_PARTITION drained for $DRAIN_S s"
  fi
  if [ "$drained" = 1 ] && [ "$(date +%s)" -ge "$drain_until" ]; then
    undrain_queue "$DRAIN_PARTITION" && drained=2
    fault drain_end "partition $DRAIN_PARTITION up again"
  fi
  # One result manifest unreadable for one poll: the newest one, a directory in its place.
  if [ "$unreadable" = 0 ] && [ "$pct" -ge 55 ]; then
    m=$(ls -t "$RUN"/results/b*/*.json 2>/dev/null | head -n1)
    if [ -n "$m" ] && mv "$m" "$m.aside" 2>/dev/null; then
      mkdir "$m"; sleep $((POLL + 1)); rmdir "$m"; mv "$m.aside" "$m"
      unreadable=1
      fault unreadable_manifest "${m#"$RUN/"} unreadable for $((POLL + 1)) s"
    fi
  fi
  # The cost windows: the "before" loop (third) and the current one (fourth).
  if [ "$MEASURE" = 1 ] && [ "$windows_started" = 0 ] && [ "$kills" = 2 ] && [ "$pct" -ge 60 ]; then
    windows_started=1; measure "$BEFORE_LABEL" 30 & measuring=$!
  fi
  if [ "$MEASURE" = 1 ] && [ "$windows_started" = 1 ] && [ "$kills" = 3 ] && [ "$pct" -ge 80 ]; then
    windows_started=2; measure "$AFTER_LABEL" 30 & measuring=$!
  fi
  # Then a window in which nothing arrives (jobs held and suspended): the poll's fixed cost.
  if [ "$MEASURE" = 1 ] && [ "$QUIET_WINDOW" = 1 ] && [ "$windows_started" = 2 ] && ! kill -0 "$measuring" 2>/dev/null && [ "$pct" -lt 97 ]; then
    windows_started=3; quiet_window 15 & measuring=$!
  fi
done
wait "$loop_pid"; loop_exit=$?
# The last loop's own count of its CPU (it ended by itself and wrote it at its end).
read -r last_polls last_cpu _ _ _ _ _ last_quiet last_quiet_cpu < <(loop_state)
total_loop_cpu=$(calc "$total_loop_cpu + $last_cpu")
# Its quiet rounds (nothing taken in, ended or submitted), over its whole life.
python3 -c 'import json,sys; p,c,q,qc=map(float,sys.argv[1:5]); print(json.dumps({"stage":"last_loop","polls":p,"cpu_ms_per_poll":1e3*c/p if p else None,"quiet_polls":q,"cpu_ms_per_quiet_poll":1e3*qc/q if q else None}))' \
  "${last_polls:-0}" "${last_cpu:-0}" "${last_quiet:-0}" "${last_quiet_cpu:-0}" >> "$WORK/windows.jsonl"
wait
submit_wall=$(calc "$(date +%s.%N) - $submit_t0")
printf '{"stage": "submit", "wall_s": %.1f, "cpu_s": %.2f, "exit": %s, "loops": %s}\n' "$submit_wall" "$total_loop_cpu" "$loop_exit" "$loops" >> "$WORK/stages.jsonl"
echo "[$(since) s] submit: the last loop exited $loop_exit; $(grep 'owner:' "loop$loops.err")"
[ "$drained" = 1 ] && undrain_queue "$DRAIN_PARTITION"
[ "$loop_exit" = 0 ] || { failed=$((failed + 1)); tail -n 5 "loop$loops.err"; }
poll_status
check batches_done "$(done_batches)" "$BATCHES"
check faults_injected "$kills $([ "$cancelled" -gt 0 ] && echo cancel) $drained $unreadable $hung" "3 cancel 2 1 1"
[ -n "${hung_pid:-}" ] && release_hung "$hung_pid"
check embed_jobs_left "$(pgrep -fc -- "embed-job --run-dir $RUN " || true)" 0
if [ -n "$hung_batch" ]; then
  # The scheduler records a job's end a moment after it (Slurm's accounting, PBS's history).
  for _ in $(seq 1 30); do
    hung_state=$(timed_out_state "$hung_job")
    [ -n "$hung_state" ] && break
    sleep 1
  done
  check hung_job_timed_out "$hung_state" TIMEOUT
fi

# The shards, read by pyarrow: rows, ids unique, = the corpus's papers less the quarantined.
read -r shard_rows shard_unique good < <(python3 - "$WORK" <<'PY'
import glob, gzip, json, sys, pyarrow.parquet as pq
work = sys.argv[1]
ids = []
for f in glob.glob(f"{work}/run/shards/*.parquet"):
    ids += pq.read_table(f, columns=["id"]).column("id").to_pylist()
papers = sum(1 for f in glob.glob(f"{work}/corpus/*.jsonl.gz") for _ in gzip.open(f, "rt"))
papers += pq.read_metadata(f"{work}/corpus/extra.parquet").num_rows
quarantined = sum(1 for _ in open(f"{work}/run/quarantine.jsonl")) if glob.glob(f"{work}/run/quarantine.jsonl") else 0
print(len(ids), len(set(ids)), papers - quarantined)
PY
)
check shard_rows_are_good_papers "$shard_rows" "$good"
check shard_ids_unique "$shard_unique" "$shard_rows"
if [ "$SUBMIT_ONLY" = 1 ]; then
  for w in $(cat "$WORK/windows.jsonl" 2>/dev/null | tr -d ' '); do echo "window: $w"; done
  echo "checks failed: $failed"
  exit $((failed > 0))
fi

# ---------------------------------------------------------------- upload
target=()
if [ "$PEERS" -gt 0 ]; then
  echo "== Qdrant: a cluster of $PEERS peers on loopback (.ci/qdrant/qdrant-cluster.sh)"
  cluster_env() { env QDRANT_BIN="$QDRANT_BIN" QDRANT_HOME="$WORK/qdrant" QDRANT_PEERS="$PEERS" QDRANT_BASE_PORT="$PORT_BASE" "$@"; }
  cluster_env bash "$HERE/.ci/qdrant/qdrant-cluster.sh" start > qdrant.env 2> qdrant.log || { echo "the cluster did not start: $(tail -n 3 qdrant.log)"; exit 1; }
  n=$(curl -s "http://127.0.0.1:$PORT_BASE/cluster" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["result"]["peers"]))' 2>/dev/null || echo 0)
  check qdrant_peers "$n" "$PEERS"
  target=(--qdrant "http://127.0.0.1:$((PORT_BASE + 1))")
  if [ "$PEER_KILL" = 1 ]; then
    # A peer crashes mid-load: the load in groups (two a peer), slowed between recoveries, and
    # peer PEERS SIGKILLed once a group is recovered; then the peer started again on its
    # storage and the same command typed again, as an operator would. It must end exact.
    EMBEDFLEET_SNAPSHOT_TEST_DELAY_MS=${PEER_KILL_DELAY_MS:-800} "$BIN" upload --run-dir "$RUN" "${target[@]}" \
      --mode snapshot --group-count $((2 * PEERS)) >upload-crashed.out 2>upload-crashed.err &
    up=$!
    recovered=0
    for _ in $(seq 1 600); do
      recovered=$(python3 -c 'import sqlite3,sys; c=sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=5); print(c.execute("SELECT count(*) FROM snapshot_loads WHERE step IN (\"recovered\", \"verified\")").fetchone()[0])' "$RUN/run.db" 2>/dev/null || echo 0)
      [ "$recovered" -ge 1 ] && break
      kill -0 "$up" 2>/dev/null || break
      sleep 0.2
    done
    cluster_env bash "$HERE/.ci/qdrant/qdrant-cluster.sh" kill-peer "$PEERS" 2>>qdrant.log
    fault peer_killed "peer $PEERS SIGKILLed mid-load, $recovered of $((2 * PEERS)) groups recovered"
    wait "$up"; crashed_exit=$?
    echo "[$(since) s] the load the crash met exited $crashed_exit: $(tail -n 1 upload-crashed.err)"
    cluster_env bash "$HERE/.ci/qdrant/qdrant-cluster.sh" start-peer "$PEERS" 2>>qdrant.log
    fault peer_started "peer $PEERS started again on its storage"
  fi
  timed upload "$BIN" upload --run-dir "$RUN" "${target[@]}" --mode snapshot
  points=$(curl -s -X POST "http://127.0.0.1:$PORT_BASE/collections/papers/points/count" \
    -H 'Content-Type: application/json' -d '{"exact": true}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["count"])')
else
  timed upload "$BIN" upload --run-dir "$RUN"
  points=$(python3 -c "import qdrant_edge as q; s = q.EdgeShard.load('$RUN/qdrant/collections/papers'); print(s.count(q.CountRequest(exact=True))); s.close()")
fi
check points_are_good_papers "$points" "$good"

# ---------------------------------------------------------------- query, eval, publish
python3 - "$TERMS" "$SEED" > terms.txt <<'PY'
import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
words = ("protein folding graph neural network solar cell climate model gene expression dark "
         "matter quantum error correction soil carbon battery cathode malaria vaccine sparse "
         "attention coral reef bleaching river delta sediment language model alignment").split()
for i in range(n):
    print(" ".join(rng.choice(words) for _ in range(rng.randint(1, 4))) + f" {i}")
PY
timed query "$BIN" query --run-dir "$RUN" "${target[@]}" --model-dir "$WORK/MODEL" --devices cpu --terms terms.txt --output "$RUN/hits.parquet"
query_rows=$(python3 -c "import pyarrow.parquet as pq; print(pq.read_metadata('$RUN/hits.parquet').num_rows)" 2>/dev/null || echo 0)
check query_rows "$query_rows" $((TERMS * 10))
timed eval "$BIN" eval --run-dir "$RUN" "${target[@]}" --sample 200 --ef 16,64 --json
timed publish "$BIN" publish --run-dir "$RUN" --out "$WORK/dataset"
published=$(HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 python3 -c "import datasets; print(len(datasets.load_dataset('parquet', data_dir='$WORK/dataset/data', split='train')))" 2>/dev/null || echo 0)
check published_rows "$published" "$good"

# ---------------------------------------------------------------- report --html, --trace, metrics.prom
# The page's size and time; the trace read by pandas (a row per job attempt in run.db); the
# owner's metrics.prom checked by promtool where there is one.
report_t0=$(date +%s.%N)
"$BIN" report --run-dir "$RUN" --html "$WORK/report.html" --trace "$WORK/trace.tsv" 2>/dev/null
report_rc=$?
printf '{"stage": "report_html", "wall_s": %s, "cpu_s": 0, "exit": %s, "bytes": %s}\n' "$(calc "$(date +%s.%N) - $report_t0" 2)" "$report_rc" "$(stat -c %s "$WORK/report.html" 2>/dev/null || echo 0)" >> "$WORK/stages.jsonl"
job_rows=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM jobs').fetchone()[0])" "$RUN/run.db")
trace_rows=$(python3 -c "import pandas as pd,sys; print(len(pd.read_csv(sys.argv[1], sep='\t', na_values='-')))" "$WORK/trace.tsv" 2>/dev/null || echo 0)
check trace_rows_are_job_attempts "$trace_rows" "$job_rows"
if command -v promtool >/dev/null; then
  check metrics_prom_passes_promtool "$(promtool check metrics < "$RUN/metrics.prom" >/dev/null 2>&1 && echo ok || echo failed)" ok
fi

# ---------------------------------------------------------------- the report
python3 - "$WORK" "$BATCHES" "$PAPERS" "$failed" <<'PY' > "$WORK/report.json"
import json, os, statistics, sys
work, batches, papers, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lines = lambda f: [json.loads(l) for l in open(os.path.join(work, f))] if os.path.exists(os.path.join(work, f)) else []
lat = sorted(float(x) for x in open(os.path.join(work, "status_latency.txt")) if x.strip())
run = os.path.join(work, "run")
files = sum(len(fs) for _, _, fs in os.walk(run))
stages = lines("stages.jsonl")
submit = next((s for s in stages if s["stage"] == "submit"), {})
print(json.dumps({
    "batches": batches, "papers": papers,
    "stages": stages,
    "owner_cpu_ms_per_batch": 1e3 * submit.get("cpu_s", 0) / batches,
    "windows": lines("windows.jsonl"),
    "status_latency_s": {"n": len(lat), "p50": statistics.median(lat) if lat else None, "max": max(lat) if lat else None},
    "run_db_bytes": sum(os.path.getsize(os.path.join(run, f)) for f in os.listdir(run) if f.startswith("run.db")),
    "files_in_run_dir": files,
    "faults": lines("faults.jsonl"),
    "checks": lines("checks.jsonl"),
    "checks_failed": failed,
}, indent=1))
PY
python3 - "$WORK/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"\n{r['batches']} batches, {r['papers']} papers")
print("| stage | wall s | CPU s | exit |\n|---|---|---|---|")
for s in r["stages"]:
    print(f"| {s['stage']} | {s['wall_s']} | {s['cpu_s']} | {s['exit']} |")
print(f"owner CPU per batch: {r['owner_cpu_ms_per_batch']:.1f} ms; status latency p50 {r['status_latency_s']['p50']:.3f} s, max {r['status_latency_s']['max']:.3f} s")
print(f"run.db {r['run_db_bytes'] / 1048576:.1f} MiB; {r['files_in_run_dir']} files in the run directory")
for w in r["windows"]:
    print("window:", json.dumps(w))
kinds = {}
for f in r["faults"]:
    kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
print("faults:", ", ".join(f"{k} x{v}" for k, v in kinds.items()))
print(f"checks failed: {r['checks_failed']} of {len(r['checks'])}")
PY
[ "$PEERS" -gt 0 ] && cluster_env bash "$HERE/.ci/qdrant/qdrant-cluster.sh" stop >/dev/null 2>&1
exit $((failed > 0))
