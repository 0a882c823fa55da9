#!/usr/bin/env bash
# Every GPU check in one command, for a GPU machine with PyTorch (CUDA 13) and transformers but
# no Rust and no network: the binaries come built (benches/gpu-pack.sh -> target-gpu/). Sized
# for the device tool: 15 min of device time in all, the machine's start (a minute or more) and
# the transfers included; one command <= 600 s; at most 8 files back; 64 MiB travel:
#
#   run(command="bash benches/gpu-check.sh", carry=["target-gpu"], timeout_s=600)
#
# Steps, in order, each under `timeout` (the limit below, cut at HARD_LIMIT), each recorded in
# $WORK/steps.jsonl; plan_step below is the one source of both columns:
#
#   step           est. s  limit s  what
#   unpack              5       20  target-gpu/embedfleet.xz (CUDA 13) -> $WORK/embedfleet; its
#                                   sha256 against target-gpu/build.json (the build's identity)
#   doctor             25       60  doctor --attention: cuDNN's fused attention self-test. Only its
#                                   attention verdict decides: a refusal ("the fused attention kernel
#                                   cannot run") sets EMBEDFLEET_ATTENTION=blockwise for the rest; a
#                                   timeout or any other failure keeps fused (the binary itself
#                                   refuses to start when fused fails) and is recorded
#   peer              140      210  one PyTorch process (benches/torch_baseline.py): writes the
#                                   Qwen3-Embedding-4B-shape model (random, bf16, seed 0, HF layout)
#                                   and the fidelity cases (transformers fp32, 1 to 32,768 tokens),
#                                   then measures the same weights: uniform shapes (2 forwards), the
#                                   study's padded batches on STUDY_PAPERS=24, the sorted token
#                                   budget and one paper per forward on all MIX_PAPERS=120
#   ours               90      135  bench-gpu: the mix (the job's token budget; its vectors saved at
#                                   once), fidelity, uniform shapes (--forwards 2), the mix the
#                                   study's way
#   fidelity_blockwise 30       60  the fidelity cases again with EMBEDFLEET_ATTENTION=blockwise:
#                                   tells the fused kernel's error from the rest of the forward's
#                                   (the second GPU session lost fidelity with length); skipped,
#                                   saying so, without fidelity cases
#   oom_unplanned      40       60  GPU filled to leave weights + 6 GiB; the first SMALL_PAPERS=48 of
#                                   the mix at --batch-tokens 262144 --no-memory-plan: FAILED in the
#                                   report unless a fallback (split/sequential/chunked) is taken
#   oom_planned        35       55  the same, planned by free memory
#   two_workers        40       60  two workers on one GPU (cuda:0,0), the same 48 papers and vectors
#   decode             25       40  bench-gpu on query-time shapes (DECODE_SHAPES: 64x1, 64x16,
#                                   64x64, 1x64), 10 forwards each; the peer step timed PyTorch on
#                                   them eager and replayed from a CUDA graph (#63: "tokens/s with
#                                   and without CUDA graphs"); the report's decode table
#   families           40       75  each encoder family's tiny model (make-tiny-model --family: bert,
#                                   roberta, xlm-roberta, modernbert, gemma3_text, nomic_bert) built
#                                   anew by transformers' own class (nomic_bert: the numpy one;
#                                   benches/reference_encoder.py, its f32 vectors on the CPU at 1,
#                                   7 and 128 tokens), ours on the device in
#                                   its default dtype (bench-gpu --fidelity; bf16 on a GPU:
#                                   cuDNN's fused kernel, bidirectional and windowed bands, once
#                                   its self-test passes, else the blockwise one; the report's
#                                   attention column says which ran)
#   fp8                60      120  bench-gpu --precision fp8 (#63's opt-in FP8 projections): the mix
#                                   (its vectors against ours' bf16 ones: min and median cosine),
#                                   the fidelity cases, the uniform shapes; the report's fp8 table
#                                   sets each beside ours. In a dry run the CPU's emulation
#                                   (EMBEDFLEET_FP8_EMULATE=1)
#   cu12               10       60  target-gpu/embedfleet-cu12.xz: doctor and the 2,048-token
#                                   fidelity case, where the device has CUDA 12 libraries; skipped,
#                                   saying so, where it has none (the H200's image is CUDA 13 only,
#                                   and CUDA 12's cuBLAS alone is far over the 64 MiB that travels)
#   total             540           <= TIME_LIMIT 540 s: no step starts after it
#
# A running step is cut at HARD_LIMIT (570 s) and the report written, before the device tool's
# 600 s. A step that fails or times out is recorded with why (its `problem:` line, or its last
# line of output: a timed-out step's last progress) and with every JSON line it printed; the
# others still run. CUDA_CACHE_PATH ($WORK/cuda-cache, 4 GiB) keeps the driver's compiled PTX
# from one process to the next.
#
# Files returned in $OUT (4 of the 8 allowed): gpu-report.json (the build's identity, every step:
# status, seconds, estimate, limit, every JSON line it printed), gpu-report.md (the tables),
# gpu-check.log (progress and each step's stderr tail), steps.tar.gz (the per-step stdout and
# stderr of $WORK, small text only). The report (benches/gpu_report.py) and the archive are
# rewritten after every step and on exit (also on TERM/INT), so a kill still leaves them.
#
#   usage: bash benches/gpu-check.sh
#   env:   OUT=/tmp/gpu-check WORK=/tmp/gpu-work MIX_PAPERS=120 SMALL_PAPERS=48 STUDY_PAPERS=24
#          TIME_LIMIT=540 HARD_LIMIT=570 OOM_HEADROOM_GIB=6 STEPS="unpack doctor ..." (the others
#          are recorded skipped) DOCTOR_LIMIT=60
#   tests: FAIL_STEP=<step> (its command becomes `false`), SLOW_STEP=<step> (its command becomes
#          `sleep 3600`: a timeout), DOCTOR_DEVICES (the doctor's --devices), DOCTOR_ARGS
#
# DRY_RUN=1 runs the same script on a CPU machine with BIN=path/to/embedfleet (debug or release)
# and a tiny shape: unpack and oom_* are skipped (no GPU); the peer writes the model and runs on
# the CPU when torch and transformers import, else the model is `$BIN make-tiny-model` (no
# fidelity cases, no peer); cu12 runs when BIN_CU12 is given. tests/e2e/gpu_check.rs runs it:
#   DRY_RUN=1 BIN=target/debug/embedfleet OUT=/tmp/gc-out WORK=/tmp/gc-work bash benches/gpu-check.sh
#   ... STEPS=doctor SLOW_STEP=doctor DOCTOR_LIMIT=2 ...    (doctor times out: fused kept)
#   ... STEPS=doctor DOCTOR_DEVICES=cuda:0 ...              (an attention refusal: blockwise)
#   timeout -s TERM 15 env DRY_RUN=1 ... bash benches/gpu-check.sh   (killed: still a report)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export OUT=${OUT:-/tmp/gpu-check} WORK=${WORK:-/tmp/gpu-work}
mkdir -p "$OUT" "$WORK"
export DRY_RUN=${DRY_RUN:-0} FAIL_STEP=${FAIL_STEP:-} SLOW_STEP=${SLOW_STEP:-}
export MIX_PAPERS=${MIX_PAPERS:-120} SMALL_PAPERS=${SMALL_PAPERS:-48} STUDY_PAPERS=${STUDY_PAPERS:-24}
TIME_LIMIT=${TIME_LIMIT:-540}
HARD_LIMIT=${HARD_LIMIT:-570}
STEPS=${STEPS:-}
export OOM_HEADROOM_GIB=${OOM_HEADROOM_GIB:-6}
export LOG="$OUT/gpu-check.log"
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$WORK/cuda-cache} CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
START=$(date +%s)
export START TIME_LIMIT HARD_LIMIT

# A fresh run: only this script's own files, in $OUT and $WORK.
rm -f "$OUT"/gpu-report.json "$OUT"/gpu-report.md "$OUT"/gpu-check.log "$OUT"/steps.tar.gz
rm -f "$WORK"/steps.jsonl "$WORK"/plan.tsv "$WORK"/current "$WORK"/*.out "$WORK"/*.err \
  "$WORK"/*.skip "$WORK"/attention*.txt "$WORK"/gpu.txt "$WORK"/filled "$WORK"/model-note.txt \
  "$WORK"/build.json "$WORK"/fidelity*.json "$WORK"/vectors*.json "$WORK"/mix*.json "$WORK"/decode.json

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "== $* ($(elapsed) s)" | tee -a "$LOG" >&2; }
export -f elapsed say

# ---- the plan: step, estimate on one H200 (s), limit (s) -----------------------------------------
declare -A EST LIMIT
plan_step() { EST[$1]=$2; LIMIT[$1]=$3; printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$WORK/plan.tsv"; }
plan_step unpack          5   20
plan_step doctor         25   "${DOCTOR_LIMIT:-60}"
plan_step peer          146  210
plan_step ours           90  135
plan_step fidelity_blockwise 30 60
plan_step oom_unplanned  40   60
plan_step oom_planned    35   55
plan_step two_workers    40   60
plan_step decode         25   40
plan_step families       40   75
plan_step fp8            60  120
plan_step cu12            4   60

REPORTED_FINAL=0
report() { # [final]: the report from what $WORK holds now; never fails the script
  timeout 30 python3 benches/gpu_report.py "$WORK" "$OUT" "$START" "$TIME_LIMIT" "$DRY_RUN" "${1:-0}" \
    || echo "report: python failed (rc $?)" >>"$LOG"
  # Small per-step text files only (no weights, no vectors): under 4 MiB each.
  (cd "$WORK" && find . -maxdepth 1 -type f \( -name '*.out' -o -name '*.err' -o -name '*.txt' \
      -o -name '*.jsonl' -o -name '*.tsv' -o -name '*.json' \) -size -4M -printf '%P\n' | sort \
    | timeout 30 tar -czf "$OUT/steps.tar.gz.tmp" -T - 2>>"$LOG" \
    && mv -f "$OUT/steps.tar.gz.tmp" "$OUT/steps.tar.gz")
  rm -f "$OUT/steps.tar.gz.tmp"
}

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=$(printf '%s' "$s" | tr '\n\t\r' '   '); printf '"%s"' "$s"; }
record() { # STEP STATUS RC SECS NOTE [LIMIT]
  printf '{"step": "%s", "status": "%s", "rc": %s, "secs": %s, "estimate_s": %s, "limit_s": %s, "note": %s}\n' \
    "$1" "$2" "${3:-null}" "${4:-0}" "${EST[$1]:-null}" "${6:-${LIMIT[$1]:-null}}" "$(json_str "${5:-}")" \
    >>"$WORK/steps.jsonl"
}
skip() { record "$1" skipped "" 0 "$2"; say "step $1 skipped: $2"; report; }

CUR="" CUR_PID="" CUR_T0="" LAST_RC=""
secs_since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
step() { # NAME CMD...: CMD under timeout (the plan's limit, cut at HARD_LIMIT), stdout to
         # $WORK/NAME.out, stderr to $WORK/NAME.err; records status and seconds; never aborts.
         # A command that writes $WORK/NAME.skip (the reason) is recorded skipped.
  local name=$1; shift
  local est=${EST[$name]:-0} lim=${LIMIT[$name]:-60} now rc status note=""
  LAST_RC=""
  if [ -n "$STEPS" ] && [[ " $STEPS " != *" $name "* ]]; then skip "$name" "not in STEPS ($STEPS)"; return 0; fi
  now=$(elapsed)
  if [ "$now" -ge "$TIME_LIMIT" ]; then skip "$name" "time limit ${TIME_LIMIT} s reached at ${now} s"; return 0; fi
  if [ $((HARD_LIMIT - now)) -lt "$lim" ]; then lim=$((HARD_LIMIT - now)); note="limit cut to ${lim} s by HARD_LIMIT"; fi
  if [ "$lim" -lt 1 ]; then skip "$name" "HARD_LIMIT ${HARD_LIMIT} s reached at ${now} s"; return 0; fi
  [ "$FAIL_STEP" = "$name" ] && { set -- false; note="FAIL_STEP=$name: command replaced by false"; }
  [ "$SLOW_STEP" = "$name" ] && { set -- sleep 3600; note="SLOW_STEP=$name: command replaced by sleep 3600"; }
  say "step $name (estimate ${est} s, limit ${lim} s)"
  CUR=$name CUR_T0=$(date +%s%N)
  echo "$name $(date +%s.%N)" >"$WORK/current"
  timeout -k 5 "$lim" bash -c '"$@"' "$name" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
  CUR_PID=$!
  wait "$CUR_PID"; rc=$?
  local secs; secs=$(secs_since "$CUR_T0")
  CUR="" CUR_PID="" LAST_RC=$rc
  rm -f "$WORK/current"
  case $rc in
    0) status=ok ;;
    124|137) status="timed out"; note="${note:+$note; }cut at ${lim} s" ;;
    *) status=failed ;;
  esac
  if [ -s "$WORK/$name.skip" ]; then status=skipped; note="${note:+$note; }$(cat "$WORK/$name.skip")"; fi
  record "$name" "$status" "$rc" "$secs" "$note" "$lim"
  { echo "-- $name: $status (rc $rc, $secs s); stderr tail:"; tail -n 60 "$WORK/$name.err"; } >>"$LOG"
  say "step $name: $status (rc $rc, $secs s)"
  report
  return 0
}

FILLER=""
cleanup() { [ -n "$FILLER" ] && { kill "$FILLER" 2>/dev/null; wait "$FILLER" 2>/dev/null; }; FILLER=""; }
on_exit() {
  cleanup
  [ "$REPORTED_FINAL" = 1 ] && return
  REPORTED_FINAL=1
  report 1 >/dev/null
}
on_signal() { # SIGNAL_NUMBER: end the running step, record it and the rest, report, exit
  trap - TERM INT
  local sig=$1
  if [ -n "$CUR_PID" ]; then
    kill -TERM "$CUR_PID" 2>/dev/null; wait "$CUR_PID" 2>/dev/null
    record "$CUR" interrupted "" "$(secs_since "$CUR_T0")" "killed by signal $sig at $(elapsed) s"
    rm -f "$WORK/current"
  fi
  say "killed by signal $sig"
  cleanup
  REPORTED_FINAL=1
  report 0 >/dev/null
  exit $((128 + sig))
}
trap on_exit EXIT
trap 'on_signal 15' TERM
trap 'on_signal 2' INT
report

# ---- the commands of the steps (run under `bash -c` by step: exported) -------------------------
unpack() { # XZ DEST: decompressed, executable
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2" \
    && chmod +x "$2"
}

doctor_cmd() { # BIN: doctor with the fused attention's self-test, nothing else
  # shellcheck disable=SC2086
  "$1" doctor --devices "${DOCTOR_DEVICES:-$DEVICE}" --attention ${DOCTOR_ARGS:-}
}

attention_verdict() { # OUT_FILE RC: the attention label from doctor's verdict line alone
  local out=$1 rc=$2 refused kernel first
  refused=$(grep -m1 '^problem: the fused attention kernel cannot run on ' "$out" 2>/dev/null)
  kernel=$(grep -m1 -E '^attention on [^ ]+: ' "$out" 2>/dev/null | sed -E 's/^attention on [^ ]+: //')
  if [ -n "$refused" ]; then
    refused=${refused#problem: the fused attention kernel cannot run on }
    echo "blockwise (fused refused on ${refused%%; EMBEDFLEET_ATTENTION=*})"
  elif [ -n "$kernel" ]; then
    echo "$kernel"
  else
    first=$(grep -m1 '^problem: ' "$out" 2>/dev/null || tail -n1 "$out" 2>/dev/null)
    case $rc in
      124|137) echo "fused kept (doctor timed out before its attention verdict)" ;;
      *) echo "fused kept (doctor exited $rc without an attention verdict${first:+: ${first:0:240}})" ;;
    esac
  fi
}

peer_cmd() { # the model, the fidelity cases and the PyTorch peer, in one process
  "$BIN" make-tiny-model --out "$WORK/tok" >/dev/null || return
  if [ "$DRY_RUN" = 1 ] && ! python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "no torch/transformers here: model by make-tiny-model; no fidelity cases, no peer" >"$WORK/model-note.txt"
    "$BIN" make-tiny-model --out "$MODEL"
    return
  fi
  MODEL_OUT=$MODEL TOKENIZER=$WORK/tok/tokenizer.json FIDELITY_OUT=$WORK/fidelity.json \
    FIDELITY_LENGTHS=$LENGTHS FIDELITY_CU12_OUT=$WORK/fidelity-cu12.json CU12_LEN=$CU12_LEN \
    MIX_OUT=$WORK/mix-peer.json UNIFORM_FORWARDS=2 UNIFORM_SHAPES=$SHAPES DEVICE=${DEVICE%%:*} \
    DECODE_SHAPES=$DECODE_SHAPES DECODE_FORWARDS=10 python3 benches/torch_baseline.py
}

bench() { "$BIN" bench-gpu --model-dir "$MODEL" "$@"; }
# FP8 on a GPU; the CPU's emulation of it in a dry run (no FP8 tensor cores there).
fp8_cmd() { EMBEDFLEET_FP8_EMULATE=$DRY_RUN bench --precision fp8 "$@"; }

oom_cmd() { # BENCH ARGS...: wait for the filler's hold, then the bench
  local _
  for _ in $(seq 120); do
    [ -s "$WORK/filled" ] && break
    kill -0 "$FILLER_PID" 2>/dev/null || break # the filler died (its error is in gpu-check.log)
    sleep 0.5
  done
  [ -s "$WORK/filled" ] || { echo "the filler never held its memory (see gpu-check.log)" >&2; return 3; }
  cat "$WORK/filled"
  bench "$@"
}

families_cmd() { # each encoder family: transformers' f32 reference on the CPU, ours on $DEVICE
  local f dir rc=0
  for f in bert roberta xlm-roberta modernbert gemma3_text nomic_bert; do
    dir=$WORK/family-$f
    rm -rf "$dir"
    printf '{"event": "family", "family": "%s"}\n' "$f"
    if ! "$BIN" make-tiny-model --family "$f" --out "$dir" 2>/dev/null; then
      echo "problem: make-tiny-model --family $f failed" >&2; rc=1; continue
    fi
    if ! MODEL_DIR=$dir OUT=$WORK/family-$f.json LENGTHS="1 7 128" CASE_PREFIX="$f " HF_HUB_OFFLINE=1 \
        python3 benches/reference_encoder.py >/dev/null; then
      echo "problem: transformers' reference of $f failed" >&2; rc=1; continue
    fi
    "$BIN" bench-gpu --model-dir "$dir" --devices "$DEVICE" --skip-uniform --skip-mix \
      --fidelity "$WORK/family-$f.json" || rc=1
  done
  return $rc
}

cu12_cmd() { # doctor and one fidelity length on the CUDA 12 binary, where CUDA 12 libraries are
  local bin=$WORK/embedfleet-cu12 rc=0 libs missing
  if [ -n "${BIN_CU12:-}" ]; then bin=$BIN_CU12; else unpack target-gpu/embedfleet-cu12.xz "$bin" || return; fi
  if [ "$DRY_RUN" != 1 ]; then # CUDA 12 libraries, where some python package ships them
    libs=$(python3 - <<'PY'
import glob, os, site, sys
dirs = []
for sp in list(site.getsitepackages()) + sys.path:
    for name in ("libcublas.so.12", "libcublasLt.so.12", "libcudart.so.12", "libcurand.so.10", "libnvrtc.so.12"):
        for f in glob.glob(os.path.join(sp, "nvidia", "*", "lib", name)):
            if os.path.dirname(f) not in dirs: dirs.append(os.path.dirname(f))
print(":".join(dirs))
PY
)
    echo "CUDA 12 library dirs found: ${libs:-none}"
    [ -n "$libs" ] && export LD_LIBRARY_PATH="$libs:$LD_LIBRARY_PATH"
  fi
  missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
  if [ -n "$missing" ]; then
    echo "this device has no CUDA 12 libraries (${missing% }: not found); the CUDA 12 build is checked on a node with them" \
      | tee "$WORK/cu12.skip"
    return 0
  fi
  doctor_cmd "$bin" >"$WORK/doctor-cu12.out" 2>&1 || rc=$?
  cat "$WORK/doctor-cu12.out"
  attention_verdict "$WORK/doctor-cu12.out" "$rc" >"$WORK/attention-cu12.txt"
  if [ -s "$WORK/fidelity-cu12.json" ]; then
    case $(cat "$WORK/attention-cu12.txt") in "blockwise (fused refused"*) export EMBEDFLEET_ATTENTION=blockwise ;; esac
    "$bin" bench-gpu --model-dir "$MODEL" --devices "$DEVICE" --skip-uniform --skip-mix \
      --fidelity "$WORK/fidelity-cu12.json" || rc=$?
  else
    echo "no fidelity-cu12.json (no fidelity cases): doctor only"
  fi
  return "$rc"
}
export -f unpack doctor_cmd attention_verdict peer_cmd bench fp8_cmd oom_cmd families_cmd cu12_cmd

# ---- the run ----------------------------------------------------------------------------------
identity() { # BIN BUILD_JSON_KEY: build.json from the packer (or made here), the binary's sha256
  python3 - "$1" "$2" "$WORK/build.json" <<'PY'
import hashlib, json, os, subprocess, sys
binary, key, path = sys.argv[1:4]
try:
    build = json.load(open("target-gpu/build.json")) if key else {}
except (OSError, ValueError) as e:
    build = {"error": f"target-gpu/build.json: {e}"}
if os.path.exists(path):
    build = json.load(open(path))
if not build.get("git_commit"):
    try:
        build["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
sha = hashlib.sha256(open(binary, "rb").read()).hexdigest()
unpacked = build.setdefault("unpacked", {})
unpacked[os.path.basename(binary)] = sha
want = (build.get("binaries") or {}).get(key, {}).get("sha256")
if want:
    build["sha256_matches"] = build.get("sha256_matches", True) and want == sha
try:
    build.setdefault("version", {})[os.path.basename(binary)] = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
except Exception as e:
    build.setdefault("version", {})[os.path.basename(binary)] = f"--version failed: {e}"
json.dump(build, open(path, "w"), indent=1)
PY
}

if [ "$DRY_RUN" = 1 ]; then
  export DEVICE=cpu TWO_WORKERS=cpu:2 SHAPE=tiny SHAPES=2x64,1x256 LENGTHS="1 16 300 1000" CU12_LEN=300
  export DECODE_SHAPES=8x1,2x16
  [ -n "${BIN:-}" ] || { echo "DRY_RUN=1 needs BIN=path/to/embedfleet" >&2; exit 2; }
  export BIN
  echo "dry run on the CPU: tiny shape" >"$WORK/gpu.txt"
  skip unpack "dry run: BIN=$BIN"
  identity "$BIN" ""
else
  export DEVICE=cuda:0 TWO_WORKERS=cuda:0,0 SHAPE=4b SHAPES=64x512,16x2048,4x8192,1x32768
  export LENGTHS="1 16 512 2048 8192 32768" CU12_LEN=2048
  export DECODE_SHAPES=${DECODE_SHAPES:-64x1,64x16,64x64,1x64}
  export BIN="$WORK/embedfleet"
  step unpack unpack target-gpu/embedfleet.xz "$BIN"
  [ -x "$BIN" ] && identity "$BIN" embedfleet.xz
  # shellcheck disable=SC1091
  source .ci/cuda/gpu-env.sh || say "gpu-env.sh found no CUDA 13 libraries"
  timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    >"$WORK/gpu.txt" 2>>"$LOG" || say "nvidia-smi failed"
fi
export MODEL="$WORK/qwen3-$SHAPE-random"
report

step doctor doctor_cmd "$BIN"
if [ -n "$LAST_RC" ]; then
  attention_verdict "$WORK/doctor.out" "$LAST_RC" >"$WORK/attention.txt"
  case $(cat "$WORK/attention.txt") in
    "blockwise (fused refused"*) export EMBEDFLEET_ATTENTION=blockwise
      say "attention: $(cat "$WORK/attention.txt"); EMBEDFLEET_ATTENTION=blockwise from here on" ;;
    *) say "attention: $(cat "$WORK/attention.txt")" ;;
  esac
  report
fi

# The mix: the peer's own formula (pure python: it exists whatever the peer does), its first
# SMALL_PAPERS for the out-of-memory and two-worker checks, and 64 one-token papers.
if [ "$DRY_RUN" = 1 ]; then
  echo "[5, 300, 17, 1000, 64, 64, 900]" >"$WORK/mix.json"
  SMALL_PAPERS=4
  export STUDY_PAPERS=4 MIX_IN="$WORK/mix.json" # the peer embeds the very same papers
else
  timeout 30 python3 - "$MIX_PAPERS" "$WORK/mix.json" <<'PY'
import json, math, random, sys
random.seed(0)
chars = [min(int(random.lognormvariate(math.log(20000), 0.8)), 130000) for _ in range(int(sys.argv[1]))]
json.dump([max(16, min(32768, c * 10 // 42)) for c in chars], open(sys.argv[2], "w"))
PY
fi
python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1]))[:int(sys.argv[2])], open(sys.argv[3], 'w'))" \
  "$WORK/mix.json" "$SMALL_PAPERS" "$WORK/mix-small.json"

step peer peer_cmd
[ -s "$WORK/fidelity.json" ] || record fidelity skipped "" 0 "no fidelity cases (no torch/transformers, or the peer step failed)"

fid=(); [ -s "$WORK/fidelity.json" ] && fid=(--fidelity "$WORK/fidelity.json")
step ours bench --devices "$DEVICE" --shapes "$SHAPES" --forwards 2 --mix "$WORK/mix.json" \
  "${fid[@]}" --save-vectors "$WORK/vectors.json"
if [ -s "$WORK/fidelity.json" ]; then
  step fidelity_blockwise env EMBEDFLEET_ATTENTION=blockwise "$BIN" bench-gpu --model-dir "$MODEL" \
    --devices "$DEVICE" --skip-uniform --skip-mix --fidelity "$WORK/fidelity.json"
else
  skip fidelity_blockwise "no fidelity cases (no torch/transformers, or the peer step failed)"
fi
# The reference for the small mix: the first papers of ours (token ids are one seeded stream, so
# a prefix of the mix has the same ids).
cmp=()
if [ -s "$WORK/vectors.json" ] && timeout 60 python3 -c "
import json, sys
v = json.load(open(sys.argv[1])); n = int(sys.argv[2])
json.dump({'lengths': v['lengths'][:n], 'vectors': v['vectors'][:n]}, open(sys.argv[3], 'w'))" \
  "$WORK/vectors.json" "$SMALL_PAPERS" "$WORK/vectors-small.json"; then
  cmp=(--compare-vectors "$WORK/vectors-small.json")
fi

if [ "$DRY_RUN" = 1 ]; then
  skip oom_unplanned "dry run: no GPU to fill"
  skip oom_planned "dry run: no GPU to fill"
elif [ "$(elapsed)" -ge "$TIME_LIMIT" ]; then
  skip oom_unplanned "time limit ${TIME_LIMIT} s reached"; skip oom_planned "time limit ${TIME_LIMIT} s reached"
elif [ -n "$STEPS" ] && [[ " $STEPS " != *" oom_unplanned "* ]] && [[ " $STEPS " != *" oom_planned "* ]]; then
  skip oom_unplanned "not in STEPS ($STEPS)"; skip oom_planned "not in STEPS ($STEPS)"
else
  # Leave the weights (their file size) + 1 GiB (contexts, cuDNN workspace) + OOM_HEADROOM_GIB
  # free: the unplanned mix's largest mini-batch (~259k padded tokens) needs far more.
  weights=$(du -cb "$MODEL"/*.safetensors 2>/dev/null | tail -n1 | cut -f1)
  timeout 200 python3 - "$WORK/filled" "${weights:-8600000000}" "$OOM_HEADROOM_GIB" >>"$LOG" 2>&1 <<'PY' &
import json, sys, time, torch
weights, headroom = int(sys.argv[2]), float(sys.argv[3])
free, total = torch.cuda.mem_get_info()
keep = weights + int((1 + headroom) * 2**30)
hold = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
left = torch.cuda.mem_get_info()[0]
line = {"event": "fill", "held_gib": round(hold.numel() / 2**30, 1), "total_gib": round(total / 2**30, 1),
        "left_gib": round(left / 2**30, 1), "weights_gib": round(weights / 2**30, 1)}
open(sys.argv[1], "w").write(json.dumps(line) + "\n")
print(line, flush=True)
time.sleep(3600)
PY
  FILLER=$!
  export FILLER_PID=$FILLER
  step oom_unplanned oom_cmd --devices cuda:0 --skip-uniform --skip-study --no-memory-plan \
    --batch-tokens 262144 --mix "$WORK/mix-small.json" "${cmp[@]}"
  step oom_planned oom_cmd --devices cuda:0 --skip-uniform --skip-study --batch-tokens 262144 \
    --mix "$WORK/mix-small.json" "${cmp[@]}"
  cleanup
fi

step two_workers bench --devices "$TWO_WORKERS" --skip-uniform --skip-study \
  --mix "$WORK/mix-small.json" "${cmp[@]}"

step decode bench --devices "$DEVICE" --shapes "$DECODE_SHAPES" --forwards 10 --skip-mix

if python3 -c "import torch, transformers" 2>/dev/null; then
  step families families_cmd
else
  skip families "no torch and transformers in python3 for the families' reference"
fi

cmp_mix=(); [ -s "$WORK/vectors.json" ] && cmp_mix=(--compare-vectors "$WORK/vectors.json")
step fp8 fp8_cmd --devices "$DEVICE" --shapes "$SHAPES" --forwards 2 --skip-study \
  --mix "$WORK/mix.json" "${fid[@]}" "${cmp_mix[@]}"

if [ -n "${BIN_CU12:-}" ] || { [ "$DRY_RUN" != 1 ] && [ -f target-gpu/embedfleet-cu12.xz ]; }; then
  step cu12 cu12_cmd
  [ -x "$WORK/embedfleet-cu12" ] && identity "$WORK/embedfleet-cu12" embedfleet-cu12.xz
else
  skip cu12 "no CUDA 12 binary (target-gpu/embedfleet-cu12.xz; BIN_CU12 in a dry run)"
fi

say "done"
REPORTED_FINAL=1
report 1
