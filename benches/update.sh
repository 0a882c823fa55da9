#!/usr/bin/env bash
# A corpus update (issue 24) beside a fresh run of the new release: one script, one machine,
# the same corpus both ways.
#
#   BIN=/path/to/release/embedfleet benches/update.sh [PAPERS] [MEAN_CHARS]
#
# Release 1 is PAPERS papers (default 1000) of about MEAN_CHARS characters (default 600) of
# random words; release 2 is made from it as peS2o's releases differ: 5 % withdrawn, 3 % with a
# corrected text, 25 % new papers. Then, on the tiny model and this machine's CPU (`embedfleet run`, 2 local jobs):
# 1. release 1 run to the end into `run/` (not part of the comparison);
# 2. update: `plan --update` release 2 into `run/`, then `run` (embeds and uploads the
#    difference): wall, and the node-hours `status --json` gives release 2;
# 3. fresh: release 2 run into a new run directory `fresh/`: wall and node-hours.
# One JSON line per phase on stdout. What matters is the ratio: the tiny model's absolute
# speed says nothing of a GPU's.
set -euo pipefail
papers=${1:-1000}
mean_chars=${2:-600}
target=${CARGO_TARGET_DIR:-target}
bin=${BIN:-$target/release/embedfleet}
work=${WORK:-/var/tmp/embedfleet-updatebench-$papers}
rm -rf "$work" && mkdir -p "$work" && cd "$work"

python3 - "$papers" "$mean_chars" <<'PY'
import json, random, sys
# Papers of words drawn at random (no 200,000-character outliers, unlike `sample-corpus`: the
# comparison is of papers embedded, and a few giants would dominate both sides alike).
n, chars = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(42)
words = ["protein", "folding", "graph", "neural", "lattice", "quantum", "enzyme", "galaxy", "soil",
         "climate", "theorem", "sensor", "cell", "market", "language", "fluid", "catalyst", "orbit"]
def text():
    out = []
    while sum(len(w) + 1 for w in out) < rng.randint(chars // 2, chars * 3 // 2):
        out.append(rng.choice(words))
    return " ".join(out)
with open("r1.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": f"W{i:07d}", "text": text(), "source": "s2orc"}) + "\n")
out = open("r2.jsonl", "w")
withdrawn = changed = 0
for i, line in enumerate(open("r1.jsonl")):
    p = json.loads(line)
    if i % 20 == 0:             # 5 %
        withdrawn += 1
        continue
    if i % 100 in (7, 41, 73):  # 3 %
        p["text"] += " corrected"
        changed += 1
    out.write(json.dumps(p) + "\n")
for i in range(n // 4):         # 25 % new
    out.write(json.dumps({"id": f"N{i:07d}", "text": text(), "source": "s2orc"}) + "\n")
print(f"release 1: {n} papers; release 2: {withdrawn} withdrawn, {changed} changed, {n // 4} new", file=sys.stderr)
PY

now() { date +%s.%N; }
# Node-hours of a release, from `status --json`.
node_hours() {
  "$bin" status --run-dir "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['releases'][$2]['embed_node_hours'])"
}
embedded() {
  "$bin" status --run-dir "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['releases'][$2]['papers_embedded'])"
}
run() { "$bin" run --corpus "$1" --run-dir "$2" --papers-per-job 250 --local-jobs 2 >/dev/null 2>&1; }

t0=$(now); run r1.jsonl run; t1=$(now)
printf '{"phase":"release 1","papers":%s,"wall_s":%.2f,"node_hours":%s}\n' \
  "$(embedded run 0)" "$(echo "$t1 - $t0" | bc)" "$(node_hours run 0)"

t0=$(now)
"$bin" plan --update r2.jsonl --run-dir run >&2
t1=$(now)
run r2.jsonl run
t2=$(now)
printf '{"phase":"update","papers_embedded":%s,"plan_s":%.2f,"wall_s":%.2f,"node_hours":%s}\n' \
  "$(embedded run 1)" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t0" | bc)" "$(node_hours run 1)"

t0=$(now); run r2.jsonl fresh; t1=$(now)
printf '{"phase":"fresh release 2","papers_embedded":%s,"wall_s":%.2f,"node_hours":%s}\n' \
  "$(embedded fresh 0)" "$(echo "$t1 - $t0" | bc)" "$(node_hours fresh 0)"
