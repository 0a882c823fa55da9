#!/usr/bin/env bash
# A GPU question, cornered in one device run: the same few measurements, each in a fresh
# process, under A/B switches, so that one run says which kernel faults, which change brings
# it, or which is faster. For the GPU machine of the device tool (no Rust; the binary comes
# packed by benches/gpu-pack.sh):
#
#   run(command="bash benches/gpu-diagnose.sh", carry=["target-gpu"], timeout_s=560)
#
# Setup: the binary (target-gpu/embedfleet.xz), the 4B-shape random model, the fidelity cases,
# PyTorch's profile of PROFILE_SHAPES and its throughput on UNIFORM_SHAPES (one
# benches/torch_baseline.py process, PEER_MIX=0: no mix; the `peer` line of diag.jsonl), the
# mix of gpu-check.sh.
# Then each experiment NAME is `bench-gpu ARGS` under ENV, cut at EXP_LIMIT s; a line of
# $OUT/diag.jsonl says how it ended, its first error, and the named frames of its backtrace.
#
#   fid_*     the fidelity cases alone (one sequence a forward, 1 to 32,768 tokens)
#   small_*   the first 48 papers of the mix at --batch-tokens 262144 (planned by free memory)
#   seq_*     the mix, then the fidelity cases, in one process (how the first run faulted)
#   uni_*     the uniform shapes of gpu-check.sh alone, 4 forwards each (throughput, no profile)
#   prof_*    EF_PROFILE_STAGES=1 on the PROFILE_SHAPES: each stage of the forward timed between
#             two synchronizations, beside PyTorch's profiler on the same shapes (peer.out)
#   *_sync    CUDA_LAUNCH_BLOCKING=1 EF_SDPA_SYNC=1: the faulting launch reports its own error
#   *_static  EF_SDPA_DYNAMIC=0: no dynamic-shape plans sharing one kernel cache (the default)
#   *_dynamic EF_SDPA_DYNAMIC=1: dynamic-shape plans sharing one kernel cache
#   *_f32     --dtype f32: the model in f32 on the GPU (a numeric drift of bf16, or a fault)
#   *_dense   EF_SDPA_DENSE_SINGLE=1: one sequence as a plain BSHD tensor, no ragged offsets
#   *_before  EF_FUSED_QK_COPY=1 EF_FUSED_ZERO_ALL=1: q/k copied into the padded buffers and the
#             whole output zeroed, as before 7ec9ae7
#   *_lastall EF_LAST_LAYER_ALL_ROWS=1: the last layer on every row
#   *_blockwise EMBEDFLEET_ATTENTION=blockwise: no cuDNN at all
#   *_release EF_POOL_RELEASE=1: the memory pool hands freed memory back at every synchronization
#             (CUDA's default, and ours before the pool kept it)
#   *_noevents EF_NO_EVENT_TRACKING=1: no CUDA event recorded per tensor use (cudarc's tracking)
#   *_gemmlt  EF_GEMM_LT=1: the projections through cuBLASLt, not candle's cuBLAS call
#   *_sampler EF_MEMORY_SAMPLER=1: the peak memory polled from a second thread every millisecond
#             during the timed forwards (every figure before this switch), not the pool's mark
#   *_cublasws EF_CUBLAS_WORKSPACE=1: candle's cuBLAS handle given a 32 MiB workspace (PyTorch's)
#   *_fusedew EF_FUSED_ELEMENTWISE=1: SwiGLU, each residual add with the norm after it, and q/k's
#             head norm with the rotary, one kernel each (ours, models/cuda/elementwise.cu)
#   best      `ours` of gpu-check.sh under the switches this run found faster (uni_) by 1 % or
#             more without losing fidelity (fid_ ≥ 0.999 where run); none: the defaults
#   *_fp8     --precision fp8: the projections in FP8 (#63's opt-in path; never in `best`: it
#             changes the vectors, and a run asks for it)
#   *_fp8fast --precision fp8 with EF_FP8_FAST_ACCUM=1: Hopper's fast FP8 accumulation
#
#   env: OUT=/tmp/gpu-diag WORK=/tmp/gpu-work TIME_LIMIT=420 (no experiment starts after it)
#        PROFILE_SHAPES=64x512,16x2048,1x32768 UNIFORM_SHAPES=64x512,16x2048,4x8192,1x32768
#        FIDELITY_LENGTHS="1 16 … 32768" PYTHON=python3 TORCH_DEVICE=cuda SHAPE=4b (the torch step)
#        HARD_LIMIT=530 (every experiment ends by then) EXP_LIMIT=60 (best: 150) EXPERIMENTS="fid_default fid_sync ..." (default: all, in the order above)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export OUT=${OUT:-/tmp/gpu-diag} WORK=${WORK:-/tmp/gpu-work}
mkdir -p "$OUT" "$WORK"
TIME_LIMIT=${TIME_LIMIT:-420}
HARD_LIMIT=${HARD_LIMIT:-530}
EXP_LIMIT=${EXP_LIMIT:-60}
PROFILE_SHAPES=${PROFILE_SHAPES:-64x512,16x2048,1x32768}
UNIFORM_SHAPES=${UNIFORM_SHAPES:-64x512,16x2048,4x8192,1x32768}
FIDELITY_LENGTHS=${FIDELITY_LENGTHS:-1 16 64 100 500 512 2048 8192 32768}
# The PyTorch side (a CPU dry run: PYTHON=venv/bin/python TORCH_DEVICE=cpu SHAPE=tiny)
PYTHON=${PYTHON:-python3} TORCH_DEVICE=${TORCH_DEVICE:-cuda} SHAPE=${SHAPE:-4b}
START=$(date +%s)
LOG=$OUT/diag.log
: >"$LOG"
: >"$OUT/diag.jsonl"
export RUST_BACKTRACE=1 CUDA_CACHE_PATH=$WORK/cuda-cache CUDA_CACHE_MAXSIZE=4294967296
say() { echo "== $* ($(($(date +%s) - START)) s)" | tee -a "$LOG" >&2; }
pack() {
  (cd "$WORK" && find . -maxdepth 1 -type f \( -name '*.out' -o -name '*.err' -o -name '*.txt' \) \
    -size -4M -printf '%P\n' | sort | timeout 30 tar -czf "$OUT/diag.tar.gz" -T -) 2>>"$LOG"
}
trap pack EXIT

MODEL=$WORK/qwen3-4b-random
if [ -z "${BIN:-}" ]; then # BIN=path: a binary of your own (a CPU dry run)
  BIN=$WORK/embedfleet
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    target-gpu/embedfleet.xz "$BIN" && chmod +x "$BIN" || { say "unpack failed"; exit 1; }
fi
cp target-gpu/build.json "$OUT/build.json" 2>/dev/null
# shellcheck disable=SC1091
source .ci/cuda/gpu-env.sh || say "gpu-env.sh found no CUDA 13 libraries"
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$WORK/gpu.txt" 2>&1
say "gpu: $(cat "$WORK/gpu.txt")"

timeout 30 python3 - "$WORK/mix.json" "$WORK/mix-small.json" <<'PY'
import json, math, random, sys
random.seed(0)
chars = [min(int(random.lognormvariate(math.log(20000), 0.8)), 130000) for _ in range(120)]
mix = [max(16, min(32768, c * 10 // 42)) for c in chars]
json.dump(mix, open(sys.argv[1], "w"))
json.dump(mix[:48], open(sys.argv[2], "w"))
PY

summarize() { # NAME RC SECS ENV: one line of diag.jsonl from NAME.out / NAME.err
  python3 - "$WORK/$1.out" "$WORK/$1.err" "$1" "$2" "$3" "$4" >>"$OUT/diag.jsonl" <<'PY'
import json, re, sys
out, err, name, rc, secs, env = sys.argv[1:7]
text = open(out, errors="replace").read() + "\n" + open(err, errors="replace").read()
lines = [json.loads(l) for l in open(out, errors="replace") if l.startswith("{")]
errors = [l for l in lines if l.get("event", "").endswith("_error")]
first = errors[0] if errors else None
frames = []
if first:
    for f in re.findall(r"\d+: (\S+)", first.get("error", "")):
        if f != "<unknown>" and not f.startswith(("std::", "core::", "__libc", "_start")) and f not in frames:
            frames.append(f)
print(json.dumps({
    "experiment": name, "env": env, "rc": int(rc), "secs": float(secs),
    "measured": [l.get("label") or l.get("name") for l in lines if l.get("event") in ("bench", "fidelity")],
    "cosines": {l["name"]: l.get("cosine") for l in lines if l.get("event") == "fidelity"},
    "tok_per_s": {l["label"]: round(l["real_tok_per_s"]) for l in lines if l.get("event") == "bench"},
    "stages": {l["label"]: l["stages"] for l in lines if l.get("event") == "bench" and l.get("stages")},
    "failed": [l.get("label") or l.get("name") for l in errors],
    "first_error": (first or {}).get("error", "").split("\n")[0][:600] or None,
    "frames": frames[:25],
    "problem": next((l for l in text.splitlines() if l.startswith(("problem:", "Error", "thread '"))), None),
}))
PY
}

if [ ! -s "$MODEL/config.json" ] || [ ! -s "$WORK/fidelity.json" ]; then
  say "model, fidelity cases, PyTorch's profile and its uniform shapes (torch)"
  "$BIN" make-tiny-model --out "$WORK/tok" >/dev/null
  t0=$(date +%s)
  MODEL_OUT=$MODEL TOKENIZER=$WORK/tok/tokenizer.json FIDELITY_OUT=$WORK/fidelity.json \
    FIDELITY_LENGTHS=$FIDELITY_LENGTHS DEVICE=$TORCH_DEVICE SHAPE=$SHAPE \
    PROFILE_SHAPES="${PROFILE_SHAPES//,/ }" UNIFORM_SHAPES=$UNIFORM_SHAPES PEER_MIX=0 \
    timeout 240 "$PYTHON" benches/torch_baseline.py >"$WORK/peer.out" 2>"$WORK/peer.err"
  rc=$?
  say "peer: rc $rc"
  # PyTorch's uniform shapes from this run, beside which the uni_ experiments are read.
  summarize peer "$rc" "$(($(date +%s) - t0))" "PEER_MIX=0" || true
fi
[ -s "$WORK/fidelity.json" ] || { say "no fidelity cases: $(tail -n3 "$WORK/peer.err")"; pack; exit 1; }


declare -A ENVS=(
  [default]="" [sync]="CUDA_LAUNCH_BLOCKING=1 EF_SDPA_SYNC=1" [static]="EF_SDPA_DYNAMIC=0"
  [dynamic]="EF_SDPA_DYNAMIC=1" [before]="EF_FUSED_QK_COPY=1 EF_FUSED_ZERO_ALL=1"
  [lastall]="EF_LAST_LAYER_ALL_ROWS=1" [blockwise]="EMBEDFLEET_ATTENTION=blockwise"
  [dense]="EF_SDPA_DENSE_SINGLE=1" [release]="EF_POOL_RELEASE=1" [noevents]="EF_NO_EVENT_TRACKING=1"
  [gemmlt]="EF_GEMM_LT=1" [fusedew]="EF_FUSED_ELEMENTWISE=1"
  [cublasws]="EF_CUBLAS_WORKSPACE=1" [sampler]="EF_MEMORY_SAMPLER=1"
  [fp8fast]="EF_FP8_FAST_ACCUM=1"
)
declare -A EXTRA=([f32]="--dtype f32" [fp8]="--precision fp8" [fp8fast]="--precision fp8")
FID=(--devices ${DEVICE:-cuda:0} --skip-uniform --skip-mix --fidelity "$WORK/fidelity.json")
SMALL=(--devices ${DEVICE:-cuda:0} --skip-uniform --skip-study --batch-tokens 262144 --mix "$WORK/mix-small.json")
SEQ=(--devices ${DEVICE:-cuda:0} --skip-uniform --skip-study --mix "$WORK/mix.json" --fidelity "$WORK/fidelity.json")
UNI=(--devices ${DEVICE:-cuda:0} --shapes "$UNIFORM_SHAPES" --forwards 4 --skip-mix --skip-study)
PROF=(--devices ${DEVICE:-cuda:0} --shapes "$PROFILE_SHAPES" --forwards 2 --skip-mix --skip-study)
OURS=(--devices ${DEVICE:-cuda:0} --shapes 64x512,16x2048,4x8192,1x32768 --forwards 2 --mix "$WORK/mix.json"
  --fidelity "$WORK/fidelity.json")

experiment() { # NAME: runs it, records it
  local name=$1 kind=${1%%_*} switch=${1#*_} args env now t0 rc secs limit=$EXP_LIMIT
  case $kind in
    fid) args=("${FID[@]}") ;; small) args=("${SMALL[@]}") ;; seq) args=("${SEQ[@]}") ;;
    prof) args=("${PROF[@]}") ;; uni) args=("${UNI[@]}") ;;
    best) args=("${OURS[@]}"); switch=default; limit=150 ;;
    *) say "unknown experiment $name"; return ;;
  esac
  if [ -z "${ENVS[$switch]+set}" ] && [ -z "${EXTRA[$switch]+set}" ]; then
    say "unknown experiment $name (switch $switch: one of ${!ENVS[*]} ${!EXTRA[*]})"; return
  fi
  env=${ENVS[$switch]-}
  [ "$kind" = best ] && env=$(best_env)
  [ "$kind" = prof ] && env="EF_PROFILE_STAGES=1 $env"
  # shellcheck disable=SC2206
  args+=(${EXTRA[$switch]-})
  now=$(($(date +%s) - START))
  if [ "$now" -ge "$TIME_LIMIT" ]; then say "$name skipped: time limit $TIME_LIMIT s"; return; fi
  [ $((HARD_LIMIT - now)) -lt "$limit" ] && limit=$((HARD_LIMIT - now))
  say "$name: ${env:-no env} bench-gpu ${args[*]}"
  t0=$(date +%s%N)
  # shellcheck disable=SC2086
  timeout -k 5 "$limit" env $env "$BIN" bench-gpu --model-dir "$MODEL" "${args[@]}" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  summarize "$name" "$rc" "$secs" "$env" || echo "{\"experiment\": \"$name\", \"rc\": $rc}" >>"$OUT/diag.jsonl"
  say "$name: rc $rc in $secs s"
  pack
}

best_env() { # the switches this run measured worth it: faster (uni_) by 1 % or more on the
  # uniform shapes' mean, and no fidelity case of theirs (fid_, where run) below 0.999
  python3 - "$OUT/diag.jsonl" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    runs[d["experiment"]] = d
ENV = {"gemmlt": "EF_GEMM_LT=1", "noevents": "EF_NO_EVENT_TRACKING=1", "release": "EF_POOL_RELEASE=1",
       "fusedew": "EF_FUSED_ELEMENTWISE=1", "cublasws": "EF_CUBLAS_WORKSPACE=1"}
base = runs.get("uni_default", {})
chosen = []
for switch, env in ENV.items():
    uni, fid = runs.get("uni_" + switch), runs.get("fid_" + switch)
    if not uni or uni.get("rc") != 0 or base.get("rc") != 0:
        continue
    shapes = [k for k in base.get("tok_per_s", {}) if k in uni.get("tok_per_s", {})]
    if not shapes:
        continue
    gain = sum(uni["tok_per_s"][k] / base["tok_per_s"][k] for k in shapes) / len(shapes)
    faithful = fid is None or (fid.get("rc") == 0 and fid.get("cosines")
                               and min(fid["cosines"].values()) >= 0.999)
    if gain >= 1.01 and faithful:
        chosen.append(env)
print(" ".join(chosen))
PY
}

# The default: the fidelity against the corrected reference (the fall with length was the
# reference's bf16 rotary frequencies), where the time goes beside PyTorch's profiler, the
# peak memory polled as every earlier figure was (does the poll cost throughput?), the
# memory pool kept against handed back, without event tracking, cuBLAS with a workspace, the
# projections through cuBLASLt and our fused elementwise kernels (fidelity, then throughput
# each), then gpu-check.sh's `ours` (the mix) under the switches found worth it; then, where
# time is left, the FP8 projections: their fidelity, their throughput with and without fast
# accumulation.
EXPERIMENTS=${EXPERIMENTS:-"fid_default prof_default uni_default uni_sampler uni_release uni_noevents uni_cublasws fid_gemmlt uni_gemmlt fid_fusedew uni_fusedew best fid_fp8 uni_fp8 uni_fp8fast"}
for e in $EXPERIMENTS; do experiment "$e"; done
say "done"
