#!/usr/bin/env bash
# README's "On a cluster, step by step", typed as a new user would, on the one-node Slurm of
# .ci/slurm/start-local-slurm.sh: plan, trial, dry run, submit (killed halfway and started
# again without its options), status (here and from "another login node"), upload into the
# embedded Qdrant, query as a Slurm job, eval, publish. CPU only: the tiny model stands for
# the 4B one and `--devices cpu` for the GPUs. Every command must exit 0 (the refusal on the
# other login node must exit 4). Prints each command, its exit code and its time.
#
#   bash benches/walkthrough-slurm.sh [BINARY] [WORKDIR]
#   MODEL_DIR=/var/tmp/embedfleet-models/all-MiniLM-L6-v2 bash benches/walkthrough-slurm.sh
#     (a downloaded model in place of the tiny Qwen3: another family through every step)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-${CARGO_TARGET_DIR:-target}/debug/embedfleet}")
W=${2:-$(mktemp -d /tmp/embedfleet-walkthrough.XXXXXX)}
mkdir -p "$W" && W=$(realpath "$W")
failed=0
step() { # step EXPECTED_CODE command...
  local want=$1; shift
  local t0=$(date +%s.%N)
  echo "\$ $*" | sed "s#$BIN#embedfleet#g; s#$W#\$W#g; s#^\$ e #\$ embedfleet #"
  "$@" >"$W/last.out" 2>"$W/last.err"
  local code=$?
  local t=$(echo "$(date +%s.%N) - $t0" | bc)
  tail -n 4 "$W/last.err" | sed 's/^/    /' | sed "s#$W#\$W#g"
  printf '  -> exit %s (%.1f s)%s\n' "$code" "$t" "$([ "$code" = "$want" ] || echo "  EXPECTED $want")"
  [ "$code" = "$want" ] || failed=$((failed + 1))
}
e() { "$BIN" "$@"; }

sinfo -h >/dev/null || { echo "no Slurm: run .ci/slurm/start-local-slurm.sh"; exit 2; }
cd "$W"
cat > run.toml <<TOML
[scheduler]
backend = "slurm"
[scheduler.script]
embedfleet = "$BIN"
walltime = "00:10:00"
[notify]
command = "echo \"\$EMBEDFLEET_EVENT \$EMBEDFLEET_MESSAGE\" >> $W/notify.txt"
TOML
e sample-corpus --papers 160 --mean-chars 1500 --files 2 --out corpus >/dev/null 2>&1
printf 'protein folding\nsolar cells\ngraph neural networks\nclimate models\n' > terms.txt

if [ -n "${MODEL_DIR:-}" ]; then
  echo "== 1. the model (offline: $MODEL_DIR, copied as a user carries a download)"
  step 0 cp -r "$MODEL_DIR" MODEL
else
  echo "== 1. the model (offline: the tiny Qwen3 in the Hugging Face layout)"
  step 0 e make-tiny-model --out MODEL
fi
echo "== 3. plan"
step 0 e plan --corpus corpus --run-dir run1 --papers-per-job 20
echo "== 4. trial"
step 0 e submit --run-dir run1 --config run.toml --model-dir MODEL --devices cpu --trial debug
echo "== 5. submit: a dry run first, then the loop, killed halfway and started again without its options"
step 0 e submit --run-dir run1 --config run.toml --model-dir MODEL --devices cpu --queue debug=1 --queue gpu=1 --dry-run
"$BIN" submit --run-dir run1 --config run.toml --model-dir MODEL --devices cpu --queue debug=1 --queue gpu=1 --poll-interval 2 >loop1.out 2>loop1.err &
loop=$!
for _ in $(seq 1 300); do
  done_=$(e status --run-dir run1 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["batches_by_state"].get("done",0))' 2>/dev/null || echo 0)
  [ "${done_:-0}" -ge 4 ] && break
  sleep 1
done
kill -9 $loop; wait $loop 2>/dev/null
echo "   (the loop killed with SIGKILL after $done_ of 8 batches)"
step 0 e submit --run-dir run1 --model-dir MODEL --poll-interval 2
grep -h "restart:" "$W/last.err" | sed 's/^/    /'
echo "== 6. status, here and on another login node"
step 0 e status --run-dir run1
step 0 e report --run-dir run1
if unshare -u true 2>/dev/null; then
  step 0 unshare -u sh -c "hostname login-2 && exec $BIN status --run-dir run1"
  step 4 unshare -u sh -c "hostname login-2 && exec $BIN pause --run-dir run1"
fi
echo "== 7. upload (the embedded Qdrant: no server here)"
step 0 e upload --run-dir run1
echo "== 8. query as a Slurm job"
step 0 e query --run-dir run1 --model-dir MODEL --terms terms.txt --output run1/hits.parquet --submit --queue debug --devices cpu --poll-interval 1
echo "== 9. eval"
step 0 e eval --run-dir run1 --sample 50
echo "== 10. publish"
step 0 e publish --run-dir run1 --out dataset
python3 - <<PY
import pyarrow.parquet as pq, glob
rows = sum(pq.read_table(f).num_rows for f in glob.glob("$W/dataset/**/*.parquet", recursive=True))
print(f"   published parquet rows (embeddings and query hits), read by pyarrow: {rows}")
PY
echo "   notify events: $(cut -d' ' -f1 notify.txt 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
echo "== $failed step(s) exited otherwise than expected (work dir $W)"
exit $((failed > 0))
