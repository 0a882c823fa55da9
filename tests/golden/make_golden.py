#!/usr/bin/env python3
"""Reference embeddings of the tiny Qwen3 model, from transformers' Qwen3Model.

The Rust test `models/tests/golden.rs` compares embedfleet-models against this file.

    cargo run -p embedfleet-models --example write_tiny_model -- /tmp/tiny 0
    pip install torch transformers tokenizers      # CPU wheels are enough
    python tests/golden/make_golden.py /tmp/tiny tests/golden/tiny_seed0.json

For each text: ids = tokenizer(text, no special tokens) + [<|endoftext|>], the hidden state of
the last token of Qwen3Model (final norm included), L2-normalised. Each text runs alone (no
padding), in float32 with eager attention, so the reference has no masking of its own to get
wrong. Queries use Qwen3-Embedding's format: "Instruct: {task}\\nQuery:{text}".
"""

import json
import sys

import torch
import transformers
from tokenizers import Tokenizer
from transformers import Qwen3Model

TASK = "Given a web search query, retrieve relevant passages that answer the query"

LONG = " ".join(
    f"Section {i}: the embedding of a long paper must not depend on how attention is tiled;"
    f" tokens at position {i * 37} attend to every earlier token of the same paper."
    for i in range(12)
)

TEXTS = [
    {"name": "short", "text": "The capital of France is Paris."},
    {"name": "one_word", "text": "a"},
    {"name": "long", "text": LONG},
    {"name": "unicode", "text": "Zürich – 北京大学 研究 🚀 naïve café, Ελληνικά και русский текст."},
    {"name": "whitespace_only", "text": "   \n\t  "},
    {"name": "empty", "text": ""},
    {"name": "query", "text": f"Instruct: {TASK}\nQuery:What is the capital of China?"},
    {"name": "newlines", "text": "Abstract\n\nWe study embeddings.\r\nResults:\n  1. fast\n  2. exact"},
]


def main() -> None:
    model_dir, out_path = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    eos = tok.token_to_id("<|endoftext|>")
    model = Qwen3Model.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    cases = []
    for case in TEXTS:
        ids = tok.encode(case["text"], add_special_tokens=False).ids + [eos]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        emb = torch.nn.functional.normalize(hidden.double(), dim=0)
        cases.append({**case, "ids": ids, "embedding": [round(float(x), 8) for x in emb]})
        print(f"{case['name']}: {len(ids)} tokens", file=sys.stderr)
    result = {
        "model": "write_tiny_model seed 0",
        "reference": f"transformers {transformers.__version__} Qwen3Model, torch {torch.__version__}, float32, eager",
        "pooling": "last token, L2-normalised",
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
