#!/usr/bin/env python3
"""sentence-transformers itself as the truth of model directories' vectors, for embedfleet's
parity test (tests/e2e/st_parity.rs): what a user's own script gets from the same directory.

JOBS is a JSON file: a list of jobs, done in order in this one process (sentence-transformers
and torch take seconds to import). Each job:

  model_dir       a model directory sentence-transformers loads (a tiny one embedfleet wrote,
                  or a real download);
  texts           a JSON file: a list of texts;
  out             the JSON written (below);
  cut_to_context  true: each text is first cut, at the end of a token, to what the model reads
                  whole with its document prompt (its max_seq_length), so that neither side
                  truncates or chunks it;
  resave          a directory the model is then saved to by `SentenceTransformer.save`, the
                  layout sentence-transformers writes today (a later job may load it);
  max_seq_length  with resave: the length it is saved with;
  documents_only  true: no `queries`.

`out` holds the library versions, the directory's max_seq_length as sentence-transformers reads
it, the texts used, and for `documents` and `queries` each text's vector and the ids its
tokenizer gave the text with its prompt (for a message when a vector differs).

Queries are `encode_query` (the directory's `query` prompt). Documents are `encode_document`
with the prompt embedfleet writes before a paper (docs/models.md, "How texts are read"): the
file's `document` prompt, else `passage` or `corpus` (E5's), else the `default_prompt_name`'s.
sentence-transformers' `encode_document` applies only a `document` prompt; an E5 model card asks
for `passage: ` before each passage, which embedfleet applies.
"""
import json
import os

import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer

VERSIONS = {
    "sentence_transformers": sentence_transformers.__version__,
    "transformers": transformers.__version__,
    "tokenizers": tokenizers.__version__,
}


def document_prompt(d):
    path = os.path.join(d, "config_sentence_transformers.json")
    if not os.path.exists(path):
        return ""
    config = json.load(open(path))
    declared = config.get("prompts") or {}
    names = ["document", "passage", "corpus", config.get("default_prompt_name")]
    return next((declared[n] for n in names if n in declared), "")


def cut_to_context(model, tokenizer, prompt, texts):
    room = model.max_seq_length - len(tokenizer("")["input_ids"])
    cut = []
    for text in texts:
        enc = tokenizer(prompt + text, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) > room:
            text = text[:enc["offset_mapping"][room - 1][1] - len(prompt)]
        cut.append(text)
    return cut


def run(job):
    torch.manual_seed(0)
    d = job["model_dir"]
    model = SentenceTransformer(d, device="cpu", local_files_only=True)
    tokenizer = model[0].tokenizer
    texts = json.load(open(job["texts"]))
    doc_prompt = document_prompt(d)
    query_prompt = model.prompts.get("query", "")
    if job.get("cut_to_context"):
        texts = cut_to_context(model, tokenizer, doc_prompt, texts)

    def side(encode, prompt):
        vectors = encode(texts, prompt=prompt, convert_to_numpy=True, normalize_embeddings=True)
        ids = [tokenizer(prompt + t)["input_ids"] for t in texts]
        return {"prompt": prompt, "vectors": vectors.tolist(), "ids": ids}

    out = {
        "versions": VERSIONS,
        "max_seq_length": model.max_seq_length,
        "texts": texts,
        "documents": side(model.encode_document, doc_prompt),
    }
    if not job.get("documents_only"):
        out["queries"] = side(model.encode_query, query_prompt)
    json.dump(out, open(job["out"], "w"))
    if job.get("resave"):
        if job.get("max_seq_length"):
            model.max_seq_length = job["max_seq_length"]
        model.save(job["resave"])
    print(json.dumps({"model_dir": d, "texts": len(texts), "max_seq_length": out["max_seq_length"],
                      "document_prompt": doc_prompt, "query_prompt": query_prompt}))


for job in json.load(open(os.environ["JOBS"])):
    run(job)
print(json.dumps(VERSIONS))
