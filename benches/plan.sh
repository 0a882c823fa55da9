#!/usr/bin/env bash
# Planning throughput against `gzip -dc` of the same files, in the same run.
#   benches/plan.sh [PAPERS] [FILES] [MEAN_CHARS]     (default 200000 8 20000)
# Needs a release build (cargo build --release) and GNU time. Prints a markdown table row set.
set -euo pipefail
papers=${1:-200000}; files=${2:-8}; mean=${3:-20000}
bin=${EMBEDFLEET_BIN:-${CARGO_TARGET_DIR:-target}/release/embedfleet}
work=${BENCH_DIR:-/var/tmp/embedfleet-bench}/plan-$papers-$files-$mean
mkdir -p "$work"
if [ ! -d "$work/corpus" ]; then
  "$bin" sample-corpus --papers "$papers" --files "$files" --mean-chars "$mean" --out "$work/corpus"
fi
gz_bytes=$(cat "$work"/corpus/*.jsonl.gz | wc -c)
text_bytes=$(gzip -dc "$work"/corpus/*.jsonl.gz | wc -c)
measure() { # label, command... -> seconds and peak RSS (KiB)
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/$label.log" || { cat "$work/$label.log"; exit 1; }
  read -r secs rss <"$work/time"
  echo "$label $secs $rss"
}
sync
read -r _ gz_s _ < <(measure gzip bash -c "gzip -dc $work/corpus/*.jsonl.gz")
rows=()
for threads in 1 2; do
  rm -rf "$work/run$threads"
  read -r _ secs rss < <(measure "plan$threads" "$bin" plan --corpus "$work/corpus" --run-dir "$work/run$threads" --threads "$threads")
  rows+=("$threads $secs $rss")
done
awk -v p="$papers" -v tb="$text_bytes" -v gzs="$gz_s" -v gzb="$gz_bytes" 'BEGIN {
  printf "corpus: %d papers, %d files, %.0f MB JSON (%.0f MB gzip)\n\n", p, '"$files"', tb/1e6, gzb/1e6
  printf "| what | threads | seconds | papers/s | MB/s of JSON | ratio to gzip -dc per core | peak RSS MiB |\n|---|---|---|---|---|---|---|\n"
  printf "| gzip -dc (floor) | 1 | %.2f | %.0f | %.0f | 1.00 | - |\n", gzs, p/gzs, tb/1e6/gzs
}'
for row in "${rows[@]}"; do
  set -- $row
  awk -v t="$1" -v s="$2" -v r="$3" -v p="$papers" -v tb="$text_bytes" -v gzs="$gz_s" 'BEGIN {
    printf "| embedfleet plan | %d | %.2f | %.0f | %.0f | %.2f | %.0f |\n", t, s, p/s, tb/1e6/s, (gzs/s)/t, r/1024
  }'
done
du -sh "$work/run2/batches" | awk '{print "\nbatch files: " $1}'
du -sh "$work/run2/run.db" | awk '{print "run.db: " $1}'
