#!/usr/bin/env bash
# Padding waste and CPU throughput of the two mini-batch rules on the same sample corpus:
# the study's heuristic (`--batching chars`: <= 150,000 chars and <= 8 papers, corpus order) and
# the default length-sorted token budget (`--batching tokens`, 32,768 tokens). Same corpus, same
# tiny model, same devices; the batches of the two runs are embedded alternately (A1 B1 A2 B2 ...)
# so machine noise hits both alike. Prints `report --json` figures as a markdown table.
#   benches/padding.sh [PAPERS] [MEAN_CHARS] [PAPERS_PER_JOB] [DEVICES]   (default 400 2000 100 cpu)
set -euo pipefail
papers=${1:-400}; mean=${2:-2000}; per_job=${3:-100}; devices=${4:-cpu}
bin=${EMBEDFLEET_BIN:-${CARGO_TARGET_DIR:-target}/debug/embedfleet}
work=${BENCH_DIR:-/var/tmp/embedfleet-bench}/padding-$papers-$mean-$per_job
rm -rf "$work"; mkdir -p "$work"
"$bin" sample-corpus --papers "$papers" --mean-chars "$mean" --out "$work/corpus.jsonl.gz" 2>/dev/null
"$bin" make-tiny-model --out "$work/model" 2>/dev/null
for rule in chars tokens; do
  "$bin" plan --corpus "$work/corpus.jsonl.gz" --run-dir "$work/$rule" --batching "$rule" \
    --papers-per-job "$per_job" 2>/dev/null
done
batches=$("$bin" status --run-dir "$work/chars" --json | jq .batches)
started=$(date +%s)
for b in $(seq 1 "$batches"); do
  for rule in chars tokens; do
    "$bin" embed-job --run-dir "$work/$rule" --batch "$b" --model-dir "$work/model" \
      --devices "$devices" --shard-papers "$per_job" 2>>"$work/$rule.log"
  done
done
echo "corpus: $papers papers (mean $mean chars), $batches batches of $per_job per rule, devices $devices, tiny model; $(( $(date +%s) - started )) s"
echo
echo "| rule | padding / real tokens | real tokens | padding tokens | papers/s (job) | tokens/s (job) | tokens/s per batch (mean ± std) | inference s per batch (mean ± std) | inference share | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for rule in chars tokens; do
  "$bin" report --run-dir "$work/$rule" --json | jq -r --arg rule "$rule" '.summary as $s |
    "| \($rule) | \($s.padding_share * 1000 | round / 1000) | \($s.tokens) | \($s.padding_tokens) | \($s.job_papers_per_s * 100 | round / 100) | \($s.job_tokens_per_s | round) | \($s.tokens_per_s.mean | round) ± \($s.tokens_per_s.std | round) | \($s.inference_s.mean * 100 | round / 100) ± \($s.inference_s.std * 100 | round / 100) | \($s.inference_share * 100 | round)% | \(($s.peak_memory_bytes // 0) / 1048576 | round) |"'
done
tok_c=$("$bin" report --run-dir "$work/chars" --json | jq .summary.job_tokens_per_s)
tok_t=$("$bin" report --run-dir "$work/tokens" --json | jq .summary.job_tokens_per_s)
echo
echo "throughput ratio tokens/chars (job tokens/s): $(jq -n "$tok_t / $tok_c * 100 | round / 100")"
