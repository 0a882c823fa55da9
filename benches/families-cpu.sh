#!/usr/bin/env bash
# Each encoder family's CPU forward beside transformers', in one run (issue 62): for each family
# a model at a real model's width (benches/families_cpu.py: BERT-base, ModernBERT-base,
# EmbeddingGemma-300m's, nomic-embed-text-v1.5's shapes, 4 layers), transformers' forward (for
# nomic_bert, which transformers lacks, benches/nomic_bert_torch.py: eager PyTorch, SDPA) and ours
# (models/examples/family_bench.rs, release) on the same BATCH x LEN, alternating, ROUNDS times;
# each side's median tokens/s and their ratio.
#   bash benches/families-cpu.sh [ROUNDS] [THREADS] [LEN] [BATCH]
# Needs a Python with torch and transformers: EMBEDFLEET_TORCH_PYTHON (as the tests), else
# python3; and the embedfleet binary (debug is enough: it only writes the tiny models).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../.ci/lib/err.sh"
cd "$(dirname "$0")/.."
rounds=${1:-3} threads=${2:-2} len=${3:-512} batch=${4:-8}
python=${EMBEDFLEET_TORCH_PYTHON:-python3}
target=${CARGO_TARGET_DIR:-target}
cargo build -q --bin embedfleet
cargo build --release -q -p embedfleet-models --example family_bench
work=$(mktemp -d)
log=$work/log
families="bert xlm-roberta modernbert gemma3_text nomic_bert"
for family in $families; do
  "$target/debug/embedfleet" make-tiny-model --family "$family" --out "$work/$family" 2>/dev/null
  # Makes the model at its real width; its first timing is a round's.
  "$python" benches/families_cpu.py "$work/$family" "$family" "$len" "$batch" "$threads" \
    | awk '/^\| torch /{print "torch", $4, $10}' >>"$log"
done
for round in $(seq 1 "$rounds"); do
  for family in $families; do
    RAYON_NUM_THREADS=$threads "$target/release/examples/family_bench" "$work/$family" "$len" "$batch" \
      | awk '/^\| ours /{print "ours", $4, $10}' >>"$log"
    if [ "$round" -gt 1 ]; then
      "$python" - "$work/$family" "$len" "$batch" "$threads" <<'PY' | awk -v f="$family" '{print "torch", f, $1}' >>"$log"
import json, os, statistics, sys, time, torch
d, length, batch, threads = sys.argv[1], *map(int, sys.argv[2:5])
torch.set_num_threads(threads)
if json.load(open(os.path.join(d, "config.json")))["model_type"] == "nomic_bert":
    sys.path.insert(0, "benches")  # transformers has no class: the PyTorch peer of our own
    from nomic_bert_torch import NomicBertTorch
    model = NomicBertTorch.load(d).eval()
    vocab = model.vocab_size
else:
    from transformers import AutoModel
    model = AutoModel.from_pretrained(d, attn_implementation="sdpa").float().eval()
    vocab = model.config.vocab_size
ids = torch.randint(300, vocab, (batch, length))
with torch.no_grad():
    model(input_ids=ids)
    secs = []
    for _ in range(3):
        t = time.perf_counter(); model(input_ids=ids); secs.append(time.perf_counter() - t)
print(f"{length * batch / statistics.median(secs):.0f}")
PY
    fi
  done
done
echo "threads: ours $threads (RAYON_NUM_THREADS), torch $threads (torch.set_num_threads); $batch x $len tokens a forward"
echo "| family | shape | ours (tokens/s) | transformers (tokens/s) | ratio | rounds |"
echo "|---|---|---|---|---|---|"
python3 - "$log" "$rounds" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    side, family, tps = line.split()
    rows.setdefault(family, {}).setdefault(side, []).append(float(tps))
shapes = {"bert": "BERT-base", "xlm-roberta": "XLM-R base (BERT-base)", "modernbert": "ModernBERT-base",
          "gemma3_text": "EmbeddingGemma-300m", "nomic_bert": "nomic-embed-text-v1.5 (PyTorch peer)"}
for family, sides in rows.items():
    ours, torch = statistics.median(sides["ours"]), statistics.median(sides["torch"])
    print(f"| {family} | {shapes[family]}, 4 layers | {ours:,.0f} | {torch:,.0f} | {ours / torch:.2f} | {sys.argv[2]} |")
PY
rm -rf "$work"
