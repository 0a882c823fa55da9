#!/usr/bin/env bash
# Every GPU check in one command, for a GPU machine with PyTorch (CUDA 13) and transformers but
# no Rust and no network: the binary comes built (benches/gpu-pack.sh -> target-gpu/).
#
#   1. a random Qwen3-Embedding-4B-shape model written by PyTorch (HF layout, bf16, seed 0);
#   2. the PyTorch peer (benches/torch_baseline.py) on the same shapes and paper mix;
#   3. fidelity: cosine of our bf16 vectors against transformers' (float32) for 1 to 32,768
#      tokens;
#   4. bench-gpu: every uniform shape, the mix batched the job's way and the study's way;
#   5. out-of-memory: the GPU filled down to a 40 GB A100's memory, the mix with mini-batches
#      too big for it (fallbacks taken, the same vectors) and planned by free memory;
#   6. two workers on one GPU (cuda:0,0), the same vectors;
#   7. one JSON report and one table ($OUT/gpu-report.json, $OUT/gpu-report.md).
#
# A step that fails is reported and the others still run. Budget: about 8 minutes on one H200.
#   usage: bash benches/gpu-check.sh      env: OUT (default /tmp/gpu-check) MIX_PAPERS=120
#
# DRY_RUN=1 runs the same script on a CPU machine with the tiny model's shape and short
# sequences, a debug or release binary from BIN (no GPU steps: the peer, the fill, the second
# worker on one GPU), to check the script itself before GPU time is spent on it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
WORK=${WORK:-/tmp/gpu-work}
mkdir -p "$WORK"
export MIX_PAPERS=${MIX_PAPERS:-120}
LOG="$OUT/gpu-check.log"
start=$(date +%s)
say() { echo "== $* ($(( $(date +%s) - start )) s)" | tee -a "$LOG"; }
fail() { echo "{\"event\": \"error\", \"step\": \"$1\", \"rc\": $2}" >>"$OUT/errors.jsonl"; say "step $1 failed (rc $2)"; }

DRY_RUN=${DRY_RUN:-0}
if [ "$DRY_RUN" = 1 ]; then
  DEVICE=cpu TWO_WORKERS=cpu:2 SHAPE=tiny SHAPES=2x64,1x256 LENGTHS="1 16 300 1000"
  [ -n "${BIN:-}" ] || { echo "DRY_RUN=1 needs BIN=path/to/embedfleet" >&2; exit 2; }
  echo "dry run on the CPU: tiny shape" >"$OUT/gpu.txt"
else
  DEVICE=cuda:0 TWO_WORKERS=cuda:0,0 SHAPE=4b SHAPES=64x512,16x2048,4x8192,1x32768
  LENGTHS="1 16 512 2048 8192 32768"
  say "unpack the binary"
  BIN="$WORK/embedfleet"
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('target-gpu/embedfleet.xz'), open('$BIN', 'wb'))" \
    && chmod +x "$BIN" || { fail unpack $?; exit 1; }
  # shellcheck disable=SC1091
  source .ci/cuda/gpu-env.sh
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
"$BIN" doctor --devices "$DEVICE" >"$OUT/doctor.txt" 2>&1 || fail doctor $?

say "write a random $SHAPE-shape model with PyTorch, and the fidelity cases"
"$BIN" make-tiny-model --out "$WORK/tok" >/dev/null 2>&1 || fail tokenizer $?
MODEL="$WORK/qwen3-$SHAPE-random"
python3 - "$MODEL" "$WORK/tok/tokenizer.json" "$WORK/fidelity.json" "$SHAPE" "$LENGTHS" >>"$LOG" 2>&1 <<'PY' || fail model $?
import json, shutil, sys, time, torch
from transformers import Qwen3Config, Qwen3Model
out, tokenizer, cases_path, shape, lengths = sys.argv[1:6]
dims = dict(vocab_size=151665, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=40960)
if shape == "tiny":
    dims = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=2048)
cfg = Qwen3Config(**dims, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
cfg._attn_implementation = "sdpa"
device = "cuda" if torch.cuda.is_available() else "cpu"
t = time.time()
torch.manual_seed(0)
with torch.device(device):
    model = Qwen3Model(cfg).to(torch.bfloat16).eval()
model.save_pretrained(out, safe_serialization=True)
shutil.copy(tokenizer, f"{out}/tokenizer.json")
print(f"model written in {time.time() - t:.1f} s", flush=True)
# The reference: the same weights in float32, one text per forward, last token, L2-normalised.
model = model.float()
g = torch.Generator().manual_seed(1)
cases = []
for n in map(int, lengths.split()):
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    with torch.inference_mode():
        h = model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0, -1]
    emb = torch.nn.functional.normalize(h.double(), dim=0)
    cases.append({"name": f"random_{n}", "ids": ids, "embedding": [float(x) for x in emb]})
json.dump({"reference": f"transformers Qwen3Model, float32, sdpa, torch {torch.__version__}",
           "cases": cases}, open(cases_path, "w"))
print("fidelity cases written", flush=True)
PY

if [ "$DRY_RUN" = 1 ]; then
  echo "[5, 300, 17, 1000, 64, 64, 900]" >"$WORK/mix.json"
else
  say "the PyTorch peer"
  MIX_OUT="$WORK/mix.json" python3 benches/torch_baseline.py >"$OUT/torch.jsonl" 2>>"$LOG" || fail torch $?
fi

bench() { # LABEL ARGS...: one bench-gpu run, JSON lines to $OUT/LABEL.jsonl
  local label=$1; shift
  say "bench-gpu: $label"
  "$BIN" bench-gpu --model-dir "$MODEL" --mix "$WORK/mix.json" "$@" \
    >"$OUT/$label.jsonl" 2>>"$LOG" || fail "$label" $?
}
bench ours --devices "$DEVICE" --shapes "$SHAPES" --fidelity "$WORK/fidelity.json" --save-vectors "$WORK/vectors.json"

if [ "$DRY_RUN" != 1 ]; then
say "out-of-memory: fill the GPU down to a 40 GB A100"
python3 - "$WORK/filled" >>"$LOG" 2>&1 <<'PY' &
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = 40 * 2**30
hold = torch.empty(max(0, total - keep - (total - free)), dtype=torch.uint8, device="cuda")
open(sys.argv[1], "w").write(f"{hold.numel()}\n")
print(f"holding {hold.numel() / 2**30:.1f} GiB of {total / 2**30:.1f}", flush=True)
time.sleep(3600)
PY
filler=$!
for _ in $(seq 120); do [ -s "$WORK/filled" ] && break; sleep 0.5; done
bench oom_unplanned --devices cuda:0 --skip-uniform --skip-study --no-memory-plan --batch-tokens 262144 \
  --compare-vectors "$WORK/vectors.json"
bench oom_planned --devices cuda:0 --skip-uniform --skip-study --batch-tokens 262144 \
  --compare-vectors "$WORK/vectors.json"
kill "$filler" 2>/dev/null; wait "$filler" 2>/dev/null
fi

bench two_workers --devices "$TWO_WORKERS" --skip-uniform --skip-study --compare-vectors "$WORK/vectors.json"

say "report"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
def lines(name):
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
torch = {r["label"]: r for r in lines("torch") if r.get("event") == "bench"}
ours = {r["label"]: r for r in lines("ours") if r.get("event") == "bench"}
report = {"gpu": open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else None,
          "torch": lines("torch"), "ours": lines("ours"),
          "oom_unplanned": lines("oom_unplanned"), "oom_planned": lines("oom_planned"),
          "two_workers": lines("two_workers"), "errors": lines("errors")}
rows = ["| run | embedfleet tokens/s | PyTorch tokens/s | ratio | our peak GB | est. GB | PyTorch peak GB |",
        "|---|---|---|---|---|---|---|"]
best_torch_mix = max((torch[k]["real_tok_per_s"] for k in torch if not k.startswith("uniform")), default=None)
for label, r in ours.items():
    peer = torch.get(label)
    if label.startswith("mix") and best_torch_mix:
        peer = {"real_tok_per_s": best_torch_mix, "peak_mem_gb": None}
    p = peer["real_tok_per_s"] if peer else None
    ratio = f"{r['real_tok_per_s'] / p:.2f}" if p else "-"
    ours_peak = r.get("peak_mem_gb")
    ours_peak = f"{ours_peak:.1f}" if ours_peak is not None else "-"
    peer_peak = (peer or {}).get("peak_mem_gb") or "-"
    rows.append(f"| {label} | {r['real_tok_per_s']:.0f} | {p if p else '-'} | {ratio} | {ours_peak} | {r['estimate_gb']:.2f} | {peer_peak} |")
for label, r in torch.items():
    if label not in ours:
        rows.append(f"| (PyTorch) {label} | - | {r['real_tok_per_s']} | - | - | - | {r.get('peak_mem_gb')} |")
rows.append("")
rows.append("mix rows compare with PyTorch's best approach on the mix (max of its mix runs).")
fid = [r for r in lines("ours") if r.get("event") == "fidelity"]
rows.append("")
rows.append("| fidelity | tokens | cosine vs transformers fp32 |")
rows.append("|---|---|---|")
for r in fid:
    rows.append(f"| {r['name']} | {r['tokens']} | {r['cosine']:.6f} |")
rows.append("")
rows.append("| check | fallbacks (split/sequential/chunked) | lowest cosine vs the unfilled run | tokens/s |")
rows.append("|---|---|---|---|")
for name in ["oom_unplanned", "oom_planned", "two_workers"]:
    ls = lines(name)
    cmp_ = next((r for r in ls if r.get("event") == "compare"), {})
    for r in ls:
        if r.get("event") == "bench" and r["label"] == "mix_packed_token_budget":
            f = r["fallbacks"]
            rows.append(f"| {name} | {f['split']}/{f['sequential']}/{f['chunked']} | {cmp_.get('min_cosine')} | {r['real_tok_per_s']:.0f} |")
if report["errors"]:
    rows.append("")
    rows.append("errors: " + ", ".join(f"{e['step']} (rc {e['rc']})" for e in report["errors"]))
table = "\n".join(rows)
json.dump(report, open(os.path.join(out, "gpu-report.json"), "w"), indent=1)
open(os.path.join(out, "gpu-report.md"), "w").write(table + "\n")
print(table)
PY
say "done"
