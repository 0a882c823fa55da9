#!/usr/bin/env bash
# Every GPU check in one command, for a GPU machine with PyTorch (CUDA 13) and transformers but
# no Rust and no network: the binaries come built (benches/gpu-pack.sh -> target-gpu/). Run it
# with the device tool, whose limits it is sized for (15 min of device time in all, start-up
# included; one command <= 540 s; at most 8 files back from $OUT; 64 MiB carried):
#
#   run(command="bash benches/gpu-check.sh", carry=["target-gpu"], timeout_s=420)
#
# Steps, in order, each under `timeout` (limit ~1.5x its H200 estimate; the plan_step table
# below is the one source of both), each recorded in $WORK/steps.jsonl:
#
#   step           est. s  limit s  what
#   unpack              5       15  target-gpu/embedfleet.xz (CUDA 13) -> $WORK/embedfleet
#   doctor             10       20  doctor --attention first: cuDNN's fused attention self-test; if
#                                   refused, EMBEDFLEET_ATTENTION=blockwise for the rest of the run
#   model              90      135  a random Qwen3-Embedding-4B-shape model written by PyTorch (HF
#                                   layout, bf16, seed 0) and the fidelity cases (transformers fp32,
#                                   1 to 32,768 tokens; a 2,048-token file for cu12)
#   ours               50       75  bench-gpu: fidelity, uniform shapes (--forwards 2), the mix
#                                   (MIX_PAPERS=120) the job's way and the study's way
#   decode             10       20  bench-gpu on 64 one-token papers (1x1 attention shapes)
#   oom_unplanned      25       40  GPU filled to leave weights + 6 GiB; the first SMALL_PAPERS=48 of
#                                   the mix at --batch-tokens 262144 --no-memory-plan: FAILED in
#                                   the report unless a fallback (split/sequential/chunked) is taken
#   oom_planned        15       25  the same, planned by free memory
#   two_workers        15       25  two workers on one GPU (cuda:0,0), same 48 papers, same vectors
#   cu12               15       25  target-gpu/embedfleet-cu12.xz when present: doctor and the
#                                   2,048-token fidelity case (skipped when absent)
#   torch              55       85  the PyTorch peer (benches/torch_baseline.py): uniform shapes
#                                   (2 forwards), the study's padded batches on 48 papers, the
#                                   sorted token budget and one paper per forward on all 120
#   total             290           + ~5 s of reports: <= 300 s on one H200 by estimate
#
# TIME_LIMIT (default 300 s): a step not started by then is recorded as skipped; a running step
# is cut at HARD_LIMIT (default TIME_LIMIT + 90 = 390 s), so the report is written before the
# device tool's 420 s. A step that fails or times out is recorded and the others still run.
#
# Files returned in $OUT (4 of the 8 allowed): gpu-report.json (every step: status, seconds,
# estimate, limit, and every JSON line it printed, under its name), gpu-report.md (the tables),
# gpu-check.log (progress and each step's stderr tail), steps.tar.gz (the per-step stdout and
# stderr files of $WORK, small text only: no weights, no vectors). The report and the archive are
# rewritten after every step and on exit (also on TERM/INT), so a kill still leaves them.
#
#   usage: bash benches/gpu-check.sh
#   env:   OUT=/tmp/gpu-check WORK=/tmp/gpu-work MIX_PAPERS=120 SMALL_PAPERS=48 TIME_LIMIT=300
#          HARD_LIMIT=390 OOM_HEADROOM_GIB=6 FAIL_STEP=<step> (that step's command becomes `false`)
#
# DRY_RUN=1 runs the same script on a CPU machine with BIN=path/to/embedfleet (debug or release)
# and a tiny shape: unpack, oom_* and torch are skipped (no GPU); the model is written by PyTorch
# when torch and transformers import, else by `$BIN make-tiny-model` (fidelity then skipped);
# cu12 runs when BIN_CU12 is given. Checks of the script itself before GPU time is spent:
#   DRY_RUN=1 BIN=/var/tmp/embedfleet-release OUT=/tmp/gc-out WORK=/tmp/gc-work bash benches/gpu-check.sh
#   ... FAIL_STEP=ours ...                      (a failed step: still a report)
#   timeout -s TERM 15 env DRY_RUN=1 ... bash benches/gpu-check.sh   (killed: still a report)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export OUT=${OUT:-/tmp/gpu-check} WORK=${WORK:-/tmp/gpu-work}
mkdir -p "$OUT" "$WORK"
export DRY_RUN=${DRY_RUN:-0} FAIL_STEP=${FAIL_STEP:-}
export MIX_PAPERS=${MIX_PAPERS:-120} SMALL_PAPERS=${SMALL_PAPERS:-48}
TIME_LIMIT=${TIME_LIMIT:-300}
HARD_LIMIT=${HARD_LIMIT:-$((TIME_LIMIT + 90))}
export OOM_HEADROOM_GIB=${OOM_HEADROOM_GIB:-6}
export LOG="$OUT/gpu-check.log"
START=$(date +%s)
export START TIME_LIMIT HARD_LIMIT

# A fresh run: only this script's own files, in $OUT and $WORK.
rm -f "$OUT"/gpu-report.json "$OUT"/gpu-report.md "$OUT"/gpu-check.log "$OUT"/steps.tar.gz
rm -f "$WORK"/steps.jsonl "$WORK"/plan.tsv "$WORK"/current "$WORK"/*.out "$WORK"/*.err \
  "$WORK"/attention*.txt "$WORK"/gpu.txt "$WORK"/filled "$WORK"/model-note.txt \
  "$WORK"/fidelity*.json "$WORK"/vectors*.json "$WORK"/mix*.json "$WORK"/decode.json

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "== $* ($(elapsed) s)" | tee -a "$LOG" >&2; }
export -f elapsed say

# ---- the plan: step, estimate on one H200 (s), limit (s, ~1.5x) --------------------------------
declare -A EST LIMIT
ORDER=()
plan_step() { ORDER+=("$1"); EST[$1]=$2; LIMIT[$1]=$3; printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$WORK/plan.tsv"; }
plan_step unpack         5   15
plan_step doctor        10   20
plan_step model         90  135
plan_step ours          50   75
plan_step decode        10   20
plan_step oom_unplanned 25   40
plan_step oom_planned   15   25
plan_step two_workers   15   25
plan_step cu12          15   25
plan_step torch         55   85

# ---- the report: $WORK -> $OUT/gpu-report.{json,md} and $OUT/steps.tar.gz ------------------------
cat >"$WORK/report.py" <<'PY'
import json, os, sys, time
work, out, start, time_limit, dry_run, finished = sys.argv[1:7]
start, time_limit, finished = int(start), int(time_limit), finished == "1"

def read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default

def jsonl(path):
    rows = []
    try:
        with open(path, errors="replace") as f:
            for l in f:
                l = l.strip()
                if l.startswith("{"):
                    try:
                        rows.append(json.loads(l))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows

plan = []
for l in (read(os.path.join(work, "plan.tsv"), "") or "").splitlines():
    name, est, lim = l.split("\t")
    plan.append({"step": name, "estimate_s": int(est), "limit_s": int(lim)})
records = {}
for r in jsonl(os.path.join(work, "steps.jsonl")):
    records[r["step"]] = r  # the last record of a step wins
current = (read(os.path.join(work, "current"), "") or "").split()
steps = []
for p in plan:
    r = dict(p)
    if p["step"] in records:
        r.update(records[p["step"]])
    elif current and current[0] == p["step"]:
        r.update(status="running", secs=round(time.time() - float(current[1]), 1))
    else:
        r.update(status="not run")
    steps.append(r)
for name, r in records.items():  # recorded without a plan row (fidelity skipped, ...)
    if name not in {p["step"] for p in plan}:
        steps.append(r)

report = {"finished": finished, "dry_run": dry_run == "1", "elapsed_s": int(time.time()) - start,
          "time_limit_s": time_limit, "estimate_total_s": sum(p["estimate_s"] for p in plan),
          "gpu": read(os.path.join(work, "gpu.txt")),
          "attention": read(os.path.join(work, "attention.txt"), "not probed"),
          "attention_cu12": read(os.path.join(work, "attention-cu12.txt")),
          "model_note": read(os.path.join(work, "model-note.txt")),
          "steps": steps}
lines = {}
for s in steps:
    ls = jsonl(os.path.join(work, s["step"] + ".out"))
    lines[s["step"]] = ls
    report[s["step"]] = ls
doctor = read(os.path.join(work, "doctor.out"))
report["doctor_text"] = doctor.splitlines()[-40:] if doctor else None
mix, mix_torch = read(os.path.join(work, "mix.json")), read(os.path.join(work, "mix-torch.json"))
if mix and mix_torch:
    report["mix_same_as_peer"] = json.loads(mix) == json.loads(mix_torch)
report["attention_used"] = sorted({r["attention"] for ls in lines.values() for r in ls
                                   if r.get("event") == "bench" and r.get("attention")})

def mix_line(ls):
    return next((r for r in ls if r.get("event") == "bench"
                 and r.get("label") == "mix_packed_token_budget"), None)

def fallbacks(r):
    f = (r or {}).get("fallbacks") or {}
    return sum(int(f.get(k, 0)) for k in ("split", "sequential", "chunked")), f

# Checks that turn an ok exit into a failure: the out-of-memory run must fall back.
for s in steps:
    if s["step"] == "oom_unplanned" and s.get("status") == "ok":
        m = mix_line(lines["oom_unplanned"])
        n, _ = fallbacks(m)
        if m is None:
            s["status"], s["check"] = "failed", "no mix_packed_token_budget line"
        elif n == 0:
            s["status"], s["check"] = "failed", "no fallback taken: the fill left too much memory"

def distinct_plans(ls):
    # Each bench line names its attention plans, (sequences, longest length) each.
    keys = set()
    for r in ls:
        if r.get("event") == "bench":
            keys.update(tuple(p) for p in r.get("plans") or [])
    return sorted(keys)

def why(name):  # the reason a step failed, from its own output
    err = (read(os.path.join(work, name + ".err"), "") or "").splitlines()
    out = (read(os.path.join(work, name + ".out"), "") or "").splitlines()
    problems = [l for l in out + err if l.startswith("problem:")]
    tail = [l for l in err if l.strip()] or [l for l in out if l.strip() and not l.startswith("{")]
    return (problems[0] if problems else tail[-1] if tail else "")[:300]

for s in steps:
    if s.get("status") in ("failed", "timed out", "interrupted") and not s.get("check"):
        s["why"] = why(s["step"])

def status_text(s):
    st = s.get("status", "?")
    if st == "failed":
        return f"FAILED: {s['check']}" if s.get("check") else f"FAILED (rc {s.get('rc')})"
    if st == "timed out":
        return f"TIMED OUT ({s.get('limit_s')} s)"
    return st

def notes(name, s):
    ls = lines.get(name, [])
    n = []
    errs = [r for r in ls if r.get("event") == "fidelity_error"]
    if errs:
        n.append(f"{len(errs)} fidelity errors")
    berrs = [r for r in ls if r.get("event") == "bench_error"]
    if berrs:
        n.append(f"{len(berrs)} bench errors: " + ", ".join(
            f"{r.get('label')}: {str(r.get('error'))[:120]}" for r in berrs).replace("|", "/"))
    fid = [r for r in ls if r.get("event") == "fidelity"]
    if fid:
        n.append(f"fidelity min cos {min(r.get('cosine', 0) for r in fid):.6f}")
    plans = distinct_plans(ls)
    if plans:
        shown = ", ".join(f"{b}x{t}" for b, t in plans[:6]) + (" ..." if len(plans) > 6 else "")
        n.append(f"{len(plans)} attention plans ({shown})")
    build_s = sum(r.get("plan_build_s") or 0 for r in ls if r.get("event") == "bench")
    if build_s:
        n.append(f"plans built in {build_s:.1f} s before timing")
    m = mix_line(ls)
    if m:
        _, f = fallbacks(m)
        n.append(f"fallbacks {f.get('split', 0)}/{f.get('sequential', 0)}/{f.get('chunked', 0)}")
    cmp_ = next((r for r in ls if r.get("event") == "compare"), None)
    if cmp_:
        n.append(f"min cos vs unfilled {cmp_.get('min_cosine')}")
    fill = next((r for r in ls if r.get("event") == "fill"), None)
    if fill:
        n.append(f"held {fill.get('held_gib')} GiB, left {fill.get('left_gib')} GiB")
    if s.get("note"):
        n.append(s["note"])
    if s.get("why"):
        n.append(s["why"].replace("|", "/"))
    if name == "model" and report["model_note"]:
        n.append(report["model_note"])
    if name == "doctor" and report["attention"]:
        n.append("attention: " + report["attention"])
    if name == "cu12" and report["attention_cu12"]:
        n.append("attention: " + report["attention_cu12"])
    return "; ".join(n)

rows = [f"# GPU check ({'dry run, CPU' if dry_run == '1' else report['gpu'] or 'GPU'})", "",
        f"{'finished' if finished else 'NOT FINISHED'} after {report['elapsed_s']} s "
        f"(time limit {time_limit} s, estimate {report['estimate_total_s']} s); "
        f"attention: {report['attention']}"
        + (f"; used: {', '.join(report['attention_used'])}" if report["attention_used"] else ""), "",
        "| step | status | secs | est. s | limit s | JSON lines | notes |", "|---|---|---|---|---|---|---|"]
for s in steps:
    dash = lambda v: "-" if v is None else v
    rows.append(f"| {s['step']} | {status_text(s)} | {dash(s.get('secs'))} | {dash(s.get('estimate_s'))} "
                f"| {dash(s.get('limit_s'))} | {len(lines.get(s['step'], []))} | {notes(s['step'], s)} |")

def num(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "-"

torch = {r["label"]: r for r in lines.get("torch", []) if r.get("event") == "bench"}
ours = {r["label"]: r for r in lines.get("ours", []) if r.get("event") == "bench"}
if ours or torch:
    rows += ["", "| run | embedfleet tokens/s | PyTorch tokens/s | ratio | our peak GB | est. GB | PyTorch peak GB |",
             "|---|---|---|---|---|---|---|"]
    best_torch_mix = max((r.get("real_tok_per_s", 0) for k, r in torch.items()
                          if not k.startswith("uniform")), default=None)
    for label, r in ours.items():
        peer = torch.get(label)
        if label.startswith("mix") and best_torch_mix:
            peer = {"real_tok_per_s": best_torch_mix, "peak_mem_gb": None}
        p = (peer or {}).get("real_tok_per_s")
        mine = r.get("real_tok_per_s")
        ratio = f"{mine / p:.2f}" if p and mine else "-"
        rows.append(f"| {label} | {num(mine, '.0f')} | {num(p, '.0f')} | {ratio} | {num(r.get('peak_mem_gb'), '.1f')} "
                    f"| {num(r.get('estimate_gb'), '.2f')} | {num((peer or {}).get('peak_mem_gb'), '.1f')} |")
    for label, r in torch.items():
        if label not in ours:
            rows.append(f"| (PyTorch) {label} | - | {num(r.get('real_tok_per_s'), '.0f')} | - | - | - "
                        f"| {num(r.get('peak_mem_gb'), '.1f')} |")
    rows.append("")
    rows.append("mix rows compare with PyTorch's best approach on the mix (max of its mix runs; its "
                "study-padded run uses the first papers only).")
fid = [(name, r) for name, ls in lines.items() for r in ls
       if r.get("event") in ("fidelity", "fidelity_error")]
if fid:
    rows += ["", "| binary | fidelity case | tokens | cosine vs transformers fp32 |", "|---|---|---|---|"]
    for name, r in fid:
        cos = num(r.get("cosine"), ".6f") if r["event"] == "fidelity" else \
            "ERROR: " + str(r.get("error") or r.get("err") or r.get("message") or r)[:200]
        rows.append(f"| {'cu12' if name == 'cu12' else 'cu13'} ({name}) | {r.get('name')} | {r.get('tokens', '-')} | {cos} |")
table = "\n".join(rows) + "\n"
for path, text in ((os.path.join(out, "gpu-report.json"), json.dumps(report, indent=1)),
                   (os.path.join(out, "gpu-report.md"), table)):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
if finished:
    print(table)
PY

REPORTED_FINAL=0
report() { # [final]: the report from what $WORK holds now; never fails the script
  local final=${1:-0}
  timeout 30 python3 "$WORK/report.py" "$WORK" "$OUT" "$START" "$TIME_LIMIT" "$DRY_RUN" "$final" \
    || echo "report: python failed (rc $?)" >>"$LOG"
  # Small per-step text files only (no weights, no vectors): under 4 MiB each.
  (cd "$WORK" && find . -maxdepth 1 -type f \( -name '*.out' -o -name '*.err' -o -name '*.txt' \
      -o -name '*.jsonl' -o -name '*.tsv' \) -size -4M -printf '%P\n' | sort \
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

CUR="" CUR_PID="" CUR_T0=""
secs_since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
step() { # NAME CMD...: CMD under timeout (the plan's limit, cut at HARD_LIMIT), stdout to
         # $WORK/NAME.out, stderr to $WORK/NAME.err; records status and seconds; never aborts
  local name=$1; shift
  local est=${EST[$name]:-0} lim=${LIMIT[$name]:-60} now rc status note=""
  now=$(elapsed)
  if [ "$now" -ge "$TIME_LIMIT" ]; then skip "$name" "time limit ${TIME_LIMIT} s reached at ${now} s"; return 0; fi
  if [ $((HARD_LIMIT - now)) -lt "$lim" ]; then lim=$((HARD_LIMIT - now)); note="limit cut to ${lim} s by HARD_LIMIT"; fi
  if [ "$lim" -lt 1 ]; then skip "$name" "HARD_LIMIT ${HARD_LIMIT} s reached at ${now} s"; return 0; fi
  [ "$FAIL_STEP" = "$name" ] && { set -- false; note="FAIL_STEP=$name: command replaced by false"; }
  say "step $name (estimate ${est} s, limit ${lim} s)"
  CUR=$name CUR_T0=$(date +%s%N)
  echo "$name $(date +%s.%N)" >"$WORK/current"
  timeout -k 5 "$lim" bash -c '"$@"' "$name" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
  CUR_PID=$!
  wait "$CUR_PID"; rc=$?
  local secs; secs=$(secs_since "$CUR_T0")
  CUR="" CUR_PID=""
  rm -f "$WORK/current"
  case $rc in
    0) status=ok ;;
    124|137) status="timed out" ;;
    *) status=failed ;;
  esac
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
doctor_cmd() { # BIN ATTENTION_FILE: the fused attention's self-test first; plain doctor if the
               # binary has no --attention. Writes the attention label to ATTENTION_FILE.
  local bin=$1 file=$2 out rc
  out=$("$bin" doctor --devices "$DEVICE" --attention 2>&1); rc=$?
  echo "$out"
  if [ "$rc" != 0 ] && grep -q -- "unexpected argument '--attention'" <<<"$out"; then
    echo "(this binary's doctor has no --attention: plain doctor)"
    echo "not probed (this binary's doctor has no --attention)" >"$file"
    "$bin" doctor --devices "$DEVICE" 2>&1
    return
  fi
  if [ "$rc" = 0 ]; then
    if [ "$DRY_RUN" = 1 ]; then echo "cpu (no fused kernel on the CPU)" >"$file"; else echo fused >"$file"; fi
  else
    local why
    why=$(grep -i -m1 -E 'attention|cudnn|fused' <<<"$out" || tail -n1 <<<"$out")
    echo "blockwise (fused refused: ${why:0:300})" >"$file"
  fi
  return "$rc"
}

model_cmd() { # the model (and fidelity cases) in $MODEL, by PyTorch or, in a dry run without it,
              # by make-tiny-model
  "$BIN" make-tiny-model --out "$WORK/tok" >/dev/null || return
  if [ "$DRY_RUN" = 1 ] && ! python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "no torch/transformers here: model by make-tiny-model, fidelity cases skipped" >"$WORK/model-note.txt"
    "$BIN" make-tiny-model --out "$MODEL"
    return
  fi
  python3 - "$MODEL" "$WORK/tok/tokenizer.json" "$WORK/fidelity.json" "$SHAPE" "$LENGTHS" \
    "$WORK/fidelity-cu12.json" "$CU12_LEN" <<'PY'
import json, shutil, sys, time, torch
from transformers import Qwen3Config, Qwen3Model
out, tokenizer, cases_path, shape, lengths, cu12_path, cu12_len = sys.argv[1:8]
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
print(json.dumps({"event": "model_written", "secs": round(time.time() - t, 1)}), flush=True)
# The reference: the same weights in float32, one text per forward, last token, L2-normalised.
t = time.time()
model = model.float()
g = torch.Generator().manual_seed(1)
cases = []
for n in map(int, lengths.split()):
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    with torch.inference_mode():
        h = model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0, -1]
    emb = torch.nn.functional.normalize(h.double(), dim=0)
    cases.append({"name": f"random_{n}", "ids": ids, "embedding": [float(x) for x in emb]})
ref = f"transformers Qwen3Model, float32, sdpa, torch {torch.__version__}"
json.dump({"reference": ref, "cases": cases}, open(cases_path, "w"))
json.dump({"reference": ref, "cases": [c for c in cases if len(c["ids"]) == int(cu12_len)]},
          open(cu12_path, "w"))
print(json.dumps({"event": "fidelity_cases", "cases": len(cases), "secs": round(time.time() - t, 1)}),
      flush=True)
PY
}

bench() { "$BIN" bench-gpu --model-dir "$MODEL" "$@"; }

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

cu12_cmd() { # doctor and one fidelity length on the CUDA 12 binary
  local bin=$WORK/embedfleet-cu12 rc=0 libs
  if [ -n "${BIN_CU12:-}" ]; then bin=$BIN_CU12; else
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('target-gpu/embedfleet-cu12.xz'), open('$bin', 'wb'))" \
      && chmod +x "$bin" || return
  fi
  if [ "$DRY_RUN" != 1 ]; then # CUDA 12 libraries, where some python package ships them
    libs=$(python3 - <<'PY'
import glob, os, site, sys
dirs = []
for sp in list(site.getsitepackages()) + sys.path:
    for name in ("libcublas.so.12", "libcublasLt.so.12", "libcudart.so.12", "libcurand.so.10"):
        for f in glob.glob(os.path.join(sp, "nvidia", "*", "lib", name)):
            if os.path.dirname(f) not in dirs: dirs.append(os.path.dirname(f))
print(":".join(dirs))
PY
)
    echo "CUDA 12 library dirs found: ${libs:-none}"
    [ -n "$libs" ] && export LD_LIBRARY_PATH="$libs:$LD_LIBRARY_PATH"
  fi
  doctor_cmd "$bin" "$WORK/attention-cu12.txt" || rc=$?
  if [ -s "$WORK/fidelity-cu12.json" ]; then
    case $(cat "$WORK/attention-cu12.txt" 2>/dev/null) in blockwise*) export EMBEDFLEET_ATTENTION=blockwise ;; esac
    "$bin" bench-gpu --model-dir "$MODEL" --devices "$DEVICE" --skip-uniform --skip-mix \
      --fidelity "$WORK/fidelity-cu12.json" || rc=$?
  else
    echo "no fidelity-cu12.json (no fidelity cases): doctor only"
  fi
  return "$rc"
}
export -f doctor_cmd model_cmd bench oom_cmd cu12_cmd

# ---- the run ----------------------------------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
  export DEVICE=cpu TWO_WORKERS=cpu:2 SHAPE=tiny SHAPES=2x64,1x256 LENGTHS="1 16 300 1000" CU12_LEN=300
  [ -n "${BIN:-}" ] || { echo "DRY_RUN=1 needs BIN=path/to/embedfleet" >&2; exit 2; }
  export BIN
  echo "dry run on the CPU: tiny shape" >"$WORK/gpu.txt"
  skip unpack "dry run: BIN=$BIN"
else
  export DEVICE=cuda:0 TWO_WORKERS=cuda:0,0 SHAPE=4b SHAPES=64x512,16x2048,4x8192,1x32768
  export LENGTHS="1 16 512 2048 8192 32768" CU12_LEN=2048
  export BIN="$WORK/embedfleet"
  step unpack bash -c "python3 -c \"import lzma, shutil; shutil.copyfileobj(lzma.open('target-gpu/embedfleet.xz'), open('$BIN', 'wb'))\" && chmod +x '$BIN'"
  # shellcheck disable=SC1091
  source .ci/cuda/gpu-env.sh || say "gpu-env.sh found no CUDA 13 libraries"
  timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    >"$WORK/gpu.txt" 2>>"$LOG" || say "nvidia-smi failed"
fi
export MODEL="$WORK/qwen3-$SHAPE-random"

step doctor doctor_cmd "$BIN" "$WORK/attention.txt"
attention=$(cat "$WORK/attention.txt" 2>/dev/null || true)
if [ "$DRY_RUN" != 1 ] && { [ -z "$attention" ] || [ "${attention#blockwise}" != "$attention" ]; }; then
  [ -n "$attention" ] || echo "blockwise (fused not confirmed: doctor did not finish)" >"$WORK/attention.txt"
  export EMBEDFLEET_ATTENTION=blockwise
  say "attention: $(cat "$WORK/attention.txt"); EMBEDFLEET_ATTENTION=blockwise from here on"
fi

step model model_cmd
[ -s "$WORK/fidelity.json" ] || record fidelity skipped "" 0 "no fidelity cases (no torch/transformers, or the model step failed)"

# The mix: the peer's own formula (pure python, so it exists whatever the peer does), its first
# SMALL_PAPERS for the out-of-memory and two-worker checks, and 64 one-token papers.
if [ "$DRY_RUN" = 1 ]; then
  echo "[5, 300, 17, 1000, 64, 64, 900]" >"$WORK/mix.json"
  SMALL_PAPERS=4
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
python3 -c "import json; print(json.dumps([1] * 64))" >"$WORK/decode.json"

fid=(); [ -s "$WORK/fidelity.json" ] && fid=(--fidelity "$WORK/fidelity.json")
step ours bench --devices "$DEVICE" --shapes "$SHAPES" --forwards 2 --mix "$WORK/mix.json" \
  "${fid[@]}" --save-vectors "$WORK/vectors.json"
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

step decode bench --devices "$DEVICE" --skip-uniform --skip-study --mix "$WORK/decode.json"

if [ "$DRY_RUN" = 1 ]; then
  skip oom_unplanned "dry run: no GPU to fill"
  skip oom_planned "dry run: no GPU to fill"
elif [ "$(elapsed)" -ge "$TIME_LIMIT" ]; then
  skip oom_unplanned "time limit ${TIME_LIMIT} s reached"; skip oom_planned "time limit ${TIME_LIMIT} s reached"
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

if [ -n "${BIN_CU12:-}" ] || { [ "$DRY_RUN" != 1 ] && [ -f target-gpu/embedfleet-cu12.xz ]; }; then
  step cu12 cu12_cmd
else
  skip cu12 "no CUDA 12 binary (target-gpu/embedfleet-cu12.xz; BIN_CU12 in a dry run)"
fi

if [ "$DRY_RUN" = 1 ]; then
  skip torch "dry run: the peer needs a GPU"
else
  # Trimmed: 2 timed forwards per uniform shape, the study's padded batches on SMALL_PAPERS.
  step torch env MIX_OUT="$WORK/mix-torch.json" UNIFORM_FORWARDS=2 STUDY_PAPERS="$SMALL_PAPERS" \
    python3 benches/torch_baseline.py
fi

say "done"
REPORTED_FINAL=1
report 1
