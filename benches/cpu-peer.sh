#!/usr/bin/env bash
# The CPU forward beside PyTorch, in one run (issue 64): `bench` (models/examples/bench.rs,
# release) and benches/cpu_peer.py (transformers' Qwen3Model, f32, SDPA) on the same shapes,
# one after the other, ROUNDS times, alternating; each side's median tokens/s and their ratio.
#   bash benches/cpu-peer.sh [ROUNDS] [THREADS]
# Needs a Python with torch and transformers: EMBEDFLEET_TORCH_PYTHON (as the tests), else
# python3. Both sides run on THREADS threads (default 2): ours through RAYON_NUM_THREADS.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../.ci/lib/err.sh"
cd "$(dirname "$0")/.."
rounds=${1:-3} threads=${2:-2}
python=${EMBEDFLEET_TORCH_PYTHON:-python3}
cargo build --release -q -p embedfleet-models --example bench
bench=${CARGO_TARGET_DIR:-target}/release/examples/bench
log=$(mktemp)
for round in $(seq 1 "$rounds"); do
  for shape in "tiny 512,4096" "0.6b 512,4096"; do
    # shellcheck disable=SC2086
    set -- $shape
    RAYON_NUM_THREADS=$threads "$bench" "$1" "$2" "$([ "$1" = tiny ] && echo 4096 || echo 2048)" \
      | awk -v r="$round" '/^\| (tiny|0.6b) /{print "ours", $2, $4, $8, r}' >>"$log"
    "$python" benches/cpu_peer.py "$1" "$2" "$threads" \
      | awk -v r="$round" '/^\| torch /{print "torch", $4, $6, $10, r}' >>"$log"
  done
done
echo "threads: ours $threads (RAYON_NUM_THREADS; simd $(RAYON_NUM_THREADS=1 "$bench" simd 2>/dev/null || echo '?')), torch $threads (torch.set_num_threads)"
echo "| model | tokens/seq | ours (tokens/s) | PyTorch (tokens/s) | ratio | rounds |"
echo "|---|---|---|---|---|---|"
python3 - "$log" "$rounds" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    side, model, length, tps, _ = line.split()
    rows.setdefault((model, int(length)), {}).setdefault(side, []).append(float(tps))
for (model, length), sides in sorted(rows.items(), key=lambda kv: (kv[0][0] != "tiny", kv[0][1])):
    ours, torch = statistics.median(sides["ours"]), statistics.median(sides["torch"])
    print(f"| {model} | {length} | {ours:,.0f} | {torch:,.0f} | {ours / torch:.2f} | {sys.argv[2]} |")
PY
rm -f "$log"
