#!/usr/bin/env bash
# collect-fixtures.sh - drives the one-node OpenPBS of start-local-pbs.sh through every job
# state the PBS backend must read, and keeps what the real server printed as the parser tests'
# fixtures: for each case NAME, `qstat -x -f -F json IDS` (NAME.json) and `qstat -x -f IDS`
# (NAME.txt) byte for byte, and in index.tsv each file's exit code, the ids asked for and
# qstat's stderr (`-f` without `-x`, `-Q` of queues: the files say which). Run by hand (as root, a few minutes) when PBS's output must be seen again:
#
#   bash .ci/pbs/start-local-pbs.sh && bash .ci/pbs/collect-fixtures.sh
#
# It restarts the server once (the stale Exit_status case): run it while no test uses PBS.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
cd "$(dirname "$0")/../.."
NS=${NS:-embedfleet-pbs}
OUT=${OUT:-orchestrator/tests/fixtures/scheduler/pbs-real}
WORK=$(mktemp -d /tmp/pbs-fixtures.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# shellcheck disable=SC2145  # /opt/pbs/bin/ prefixes the first argument, the command's name
pbs() { ip netns exec "$NS" /opt/pbs/bin/"$@"; }
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt
printf 'case\tfile\texit\tids\tstderr\n' > "$OUT/index.tsv"

# qsub from the work directory (PBS_O_WORKDIR; the .o/.e files land there); prints the id.
sub() { (cd "$WORK" && pbs qsub "$@"); }
script() { printf '#!/bin/bash\n%s\n' "$1" > "$WORK/$2.sh"; echo "$WORK/$2.sh"; }

# One command's output as a fixture file, its exit code and stderr as a line of index.tsv.
# keep NAME FILE IDS QSTAT-ARGS...
keep() {
  local name=$1 file=$2 ids=$3; shift 3
  local rc=0
  pbs qstat "$@" > "$OUT/$file" 2> "$WORK/err" || rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$file" "$rc" "$ids" "$(tr '\n\t' '  ' < "$WORK/err")" >> "$OUT/index.tsv"
}

# Case NAME: `qstat -x -f -F json` and `qstat -x -f` of IDS (space-separated in one argument).
snap() {
  local name=$1 ids=$2
  # shellcheck disable=SC2086
  keep "$name" "$name.json" "$ids" -x -f -F json $ids
  # shellcheck disable=SC2086
  keep "$name" "$name.txt" "$ids" -x -f $ids
  echo "case $name: $ids"
}

# job_state (and the rest) of one job, from JSON.
field() {
  pbs qstat -x -f -F json "$1" 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin).get('Jobs',{}); print(next(iter(j.values()),{}).get('$2',''))"
}

# Waits until job ID's state is one of STATES (up to 120 s).
await() {
  local id=$1 states=$2 s
  for _ in $(seq 1 240); do
    s=$(field "$id" job_state)
    case " $states " in *" $s "*) return 0 ;; esac
    sleep 0.5
  done
  echo "job $id never reached $states (it is $s)" >&2; return 1
}

# A job that holds all four ngpus, so that a job asking for them waits with PBS's reason.
blocker=$(sub -q debug -l select=1:ncpus=1:ngpus=4 -l walltime=00:10:00 "$(script 'sleep 600' blocker)")
await "$blocker" R

queued=$(sub -q debug -l select=1:ncpus=1:ngpus=4 -l walltime=00:05:00 "$(script 'sleep 1' queued)")
sleep 12   # a scheduling cycle writes the comment
snap queued "$queued"
# With strict ordering the scheduler plans when the top queued job starts (as Polaris's does):
# `estimated.start_time`. On for this case only: it would hold other jobs behind the top one.
conf=/var/spool/pbs/sched_priv/sched_config
cp "$conf" "$WORK/sched_config"
sed -i 's/^strict_ordering: false/strict_ordering: true/' "$conf"
kill -HUP "$(cat /var/spool/pbs/sched_priv/sched.lock)"
pbs qmgr -c "set server scheduling = True"   # a cycle now
sleep 12
snap queued_estimated "$queued"
cp "$WORK/sched_config" "$conf"
kill -HUP "$(cat /var/spool/pbs/sched_priv/sched.lock)"

held=$(sub -h -q debug -l walltime=00:05:00 "$(script 'sleep 2' held)")
snap held "$held"
pbs qrls "$held"
snap released "$held"

running=$(sub -q debug -l walltime=00:05:00 "$(script 'sleep 600' running)")
await "$running" R
snap running "$running"

# Arrays: one whose subjobs wait (for the ngpus), one that runs, one that finished.
array_queued=$(sub -J 0-2 -q debug -l select=1:ncpus=1:ngpus=4 -l walltime=00:05:00 "$(script 'sleep 1' aq)")
sleep 12
snap array_queued "$array_queued"
array=$(sub -J 0-2 -q debug -l walltime=00:05:00 "$(script '[ "$PBS_ARRAY_INDEX" = 0 ] || sleep 60' ar)")
await "$array" B
sub0=${array/\[\]/[0]} sub1=${array/\[\]/[1]}
await "$sub0" X
await "$sub1" R
snap array_running "$array $sub0 $sub1"
pbs qdel "$array_queued"

finished0=$(sub -q debug -l walltime=00:05:00 "$(script 'true' f0)")
finished3=$(sub -q debug -l walltime=00:05:00 "$(script 'exit 3' f3)")
walltime=$(sub -q debug -l walltime=00:00:03 "$(script 'sleep 120' wall)")
await "$finished0" F; await "$finished3" F; await "$walltime" F
snap finished_0 "$finished0"
snap finished_3 "$finished3"
snap walltime_exceeded "$walltime"

# qdel of a queued job (no Exit_status) and of a running one.
pbs qdel "$queued"
await "$queued" F
snap deleted_queued "$queued"
pbs qdel "$running"
await "$running" F
snap deleted_running "$running"

never=$(sub -q debug -l select=1:ncpus=64 -l walltime=00:05:00 "$(script 'sleep 1' never)")
sleep 12
snap can_never_run "$never"
pbs qdel "$never"

# Several ids, one unknown: exit 153, the found ones still printed; one unknown alone.
snap several_one_unknown "$finished0 999999.pbshost $finished3"
snap unknown "999999.pbshost"
# A finished id without -x: exit 35.
keep finished_without_x finished_without_x.txt "$finished0" -f "$finished0"
keep finished_without_x finished_without_x.json "$finished0" -f -F json "$finished0"
keep unknown_queue unknown_queue.json nosuchqueue -Q -f -F json nosuchqueue
keep queues queues.json "" -Q -f -F json

# Limits of jobs (max_queued, max_run) on the server and a queue, as an ordinary user reads
# them (`pbsuser`, made by one-node-openpbs.sh; root where there is none): text, since the JSON
# repeats the key once per entry. Unset again after.
pbs qmgr -c 'set server max_queued = "[u:PBS_GENERIC=30], [u:pbsuser=12], [o:PBS_ALL=100]"'
pbs qmgr -c 'set server max_run = "[u:PBS_GENERIC=20]"'
pbs qmgr -c 'set queue preemptable max_queued = "[u:PBS_GENERIC=5]"'
pbs qmgr -c 'set queue preemptable max_run = "[u:pbsuser=3]"'
as_user() { if id pbsuser >/dev/null 2>&1; then ip netns exec "$NS" su pbsuser -c "/opt/pbs/bin/qstat $*"; else pbs qstat "$@"; fi; }
as_user -B -f > "$OUT/limits_server.txt"
printf 'limits_server\tlimits_server.txt\t0\t\t\n' >> "$OUT/index.tsv"
as_user -Q -f > "$OUT/limits_queues.txt"
printf 'limits_queues\tlimits_queues.txt\t0\t\t\n' >> "$OUT/index.tsv"
for a in "server max_queued" "server max_run" "queue preemptable max_queued" "queue preemptable max_run"; do
  pbs qmgr -c "unset $a"
done

# Array finished.
await "$array" F
snap array_finished "$array ${array/\[\]/[1]}"

# Preempted: a preemptable job holding the ngpus, requeued (preempt_order R) for an urgent one.
pbs qdel "$blocker"; await "$blocker" F
victim=$(sub -r y -q preemptable -l select=1:ncpus=1:ngpus=4 -l walltime=00:05:00 "$(script 'sleep 300' victim)")
await "$victim" R
urgent=$(sub -q urgent -l select=1:ncpus=1:ngpus=4 -l walltime=00:05:00 "$(script 'sleep 20' urgent)")
await "$urgent" R
snap preempted "$victim $urgent"
pbs qdel "$urgent"
await "$victim" R
snap preempted_running_again "$victim"
pbs qdel "$victim"

# The server (with its MOM) restarted under a rerunnable running job: PBS reruns it, and the
# job shows the first run's Exit_status while it runs again.
rerun=$(sub -r y -q debug -l walltime=00:05:00 "$(script 'sleep 300' rerun)")
await "$rerun" R
ip netns exec "$NS" /etc/init.d/pbs restart >/dev/null 2>&1
for _ in $(seq 1 120); do pbs qstat -B >/dev/null 2>&1 && break; sleep 0.5; done
for _ in $(seq 1 240); do [ "$(field "$rerun" run_count)" = 2 ] && [ "$(field "$rerun" job_state)" = R ] && break; sleep 0.5; done
snap restarted_rerun "$rerun"
pbs qdel "$rerun"
echo "fixtures in $OUT"
