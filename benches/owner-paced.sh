#!/usr/bin/env bash
# owner-paced.sh - the submit loop's owner CPU a busy poll at a study-like pace, through the real
# one-node Slurm (.ci/slurm/start-local-slurm.sh): 2,075 batches of 4 tiny papers, 40 jobs open
# over two oversubscribed partitions of this script's own (removed after), each job sleeping
# PACE_S seconds before it embeds, a poll every 2 s. After PACE_S + 60 s (every running job a
# paced one) it reads the loop's own counters in status-snapshot.json over a 30-s window (polls,
# CPU, CPU by part of a round, results taken in), then traces the loop's file opens, spawns and
# fsyncs for 20 s (strace.txt in WORK). Prints both windows' counters; the difference over the
# polls between them is CPU a poll. BENCHMARKS.md, "The owner's busy poll at the study's pace".
#
#   usage: PACE_S=30 [PERF=1] benches/owner-paced.sh BIN WORK
set -uo pipefail
BIN=$(realpath "$1"); WORK=$2; PACE_S=${PACE_S:-100}
NODE=$(sinfo -h -o %N | head -n1)
for p in rtpa rtpb; do scontrol create PartitionName=$p Nodes="$NODE" MaxTime=INFINITE State=UP PreemptMode=OFF OverSubscribe=FORCE:8; done
cleanup() {
  [ -n "${loop:-}" ] && kill -TERM "$loop" 2>/dev/null && wait "$loop" 2>/dev/null
  squeue -h -o '%i %o' | awk -v w="$WORK/" 'index($2, w) == 1 {print $1}' | xargs -r scancel
  sleep 2
  for p in rtpa rtpb; do scontrol delete PartitionName=$p; done
}
trap cleanup EXIT
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK" || exit 1
"$BIN" sample-corpus --papers 8300 --mean-chars 300 --files 4 --seed 2075 --out corpus >/dev/null 2>&1
"$BIN" plan --corpus corpus --run-dir run --papers-per-job 4 >/dev/null 2>&1
"$BIN" make-tiny-model --out MODEL >/dev/null 2>&1
cat > run.toml <<TOML
[scheduler]
backend = "slurm"
[scheduler.script]
embedfleet = "$BIN"
walltime = "00:10:00"
extra_directives = ["#SBATCH --mem=150M"]
setup = ["sleep $PACE_S"]
TOML
"$BIN" submit --run-dir run --config run.toml --model-dir "$WORK/MODEL" --devices cpu --queue rtpa=20 --queue rtpb=20 \
  --shard-papers 1 --poll-interval 2 --max-attempts 4 --lost-after 60 >loop.out 2>loop.err &
loop=$!
sleep $((PACE_S + 60))
state() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["submit_loop"]; print(s["polls"], s["cpu_s"], json.dumps(s.get("cpu_by_part_s",{}),separators=(",",":")), s.get("taken_in",0))' run/status-snapshot.json; }
a=$(state); sleep 30; b=$(state)
echo "window: $a -> $b"
if [ -n "${PERF:-}" ]; then
  # PERF=1: a call-graph profile of the loop's threads over 30 s (perf.data and perf.txt in WORK).
  perf record -q -F 499 --call-graph dwarf,16384 -p "$loop" -o perf.data -- sleep 30 >/dev/null 2>&1
  perf report -i perf.data --no-children --percent-limit 0.5 --stdio -g none >perf.txt 2>/dev/null
  perf report -i perf.data --children --percent-limit 2 --stdio -g none >perf-children.txt 2>/dev/null
fi
strace -f -tt -e trace=openat,execve,clone3,fsync -p "$loop" -o strace.txt & st=$!; sleep 20; kill -INT $st; wait $st 2>/dev/null
c=$(state); echo "strace window: $b -> $c"
squeue -h -o '%i %o %t' | awk -v w="$WORK/" 'index($2, w) == 1 {print $3}' | sort | uniq -c
