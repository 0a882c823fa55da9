#!/usr/bin/env python3
"""Reference vectors of an encoder family from transformers itself, for embedfleet's fidelity
test (tests/e2e/families.rs).

With PRETRAINED=1, MODEL_DIR is a real download, used as it is (its weights, and its tokenizer
through AutoTokenizer). Otherwise MODEL_DIR holds a tiny model that `embedfleet make-tiny-model --family F` wrote: its
config.json, tokenizer.json and sentence-transformers files. This script builds the model
anew with transformers' own class for that config (BertModel, XLMRobertaModel,
ModernBertModel, Gemma3TextModel, ...; NomicBERT, which transformers lacks, in numpy:
benches/nomic_bert_numpy.py), gives every parameter random values (norm weights and
biases included, so a missing bias or a `w` read as `1 + w` shows), and saves it over the
directory with `save_pretrained`: embedfleet then loads what transformers wrote. The pooling,
dense projections and normalisation are computed here from the directory's files, as
sentence-transformers computes them.

It writes to OUT (JSON):
- `cases` (named `len<N>`, after CASE_PREFIX): for each length in LENGTHS, random ids framed by the tokenizer's special tokens to
  that many tokens in all, with transformers' vector (`bench-gpu --fidelity`'s format);
- `documents`: for each line of TEXTS, the vector of the document prompt and the text (as
  given, as sentence-transformers 5.4 and later tokenise it: TEXT_RULE=stripped strips it, as 5.3
  and earlier did), cut into chunks of at most MAX_TOKENS tokens, each
  framed, each after the first opening with the prompt's own ids, the chunks' vectors combined
  by a mean weighted by their lengths and normalised: embedfleet's rule;
- `ids`: transformers' tokenizer's ids of each line of TEXTS, special tokens included.
"""
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerFast

d = os.environ["MODEL_DIR"]
seed = int(os.environ.get("SEED", "0"))
torch.manual_seed(seed)
random.seed(seed)

pretrained = os.environ.get("PRETRAINED") == "1"
raw_config = json.load(open(os.path.join(d, "config.json")))
if raw_config.get("model_type") == "nomic_bert":
    # transformers has no class for it (nomic's model card loads remote code): the published
    # architecture in numpy, written apart from embedfleet's (benches/nomic_bert_numpy.py).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nomic_bert_numpy import NomicBert

    if pretrained:
        model = NomicBert.load(raw_config, d)
    else:
        model = NomicBert.random(raw_config, seed)
        model.save(d)
    vocab_size = raw_config["vocab_size"]

    def last_hidden(ids):
        return torch.from_numpy(model(ids)).float()
else:
    config = AutoConfig.from_pretrained(d)
    vocab_size = config.vocab_size
    if pretrained:
        # A real download, as it is: its own weights, its own tokenizer files.
        model = AutoModel.from_pretrained(d, attn_implementation="eager").float().eval()
    else:
        model = AutoModel.from_config(config, attn_implementation="eager").float().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
                elif name.endswith("bias"):
                    p.normal_(0.0, 0.1)
                else:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        model.save_pretrained(d)

    def last_hidden(ids):
        return model(input_ids=torch.tensor([ids])).last_hidden_state[0]

# The sentence-transformers modules after the transformer.
modules = json.load(open(os.path.join(d, "modules.json")))
steps = []
for m in modules[1:]:
    kind = m["type"].rsplit(".", 1)[-1]
    folder = os.path.join(d, m["path"])
    if kind == "Pooling":
        c = json.load(open(os.path.join(folder, "config.json")))
        mode = c.get("pooling_mode")
        if isinstance(mode, list):
            mode = mode[0]
        if mode is None:
            mode = next(m for k, m in [("pooling_mode_cls_token", "cls"),
                                        ("pooling_mode_mean_tokens", "mean"),
                                        ("pooling_mode_lasttoken", "lasttoken")] if c.get(k))
        steps.append(("pool", mode))
    elif kind == "Dense":
        c = json.load(open(os.path.join(folder, "config.json")))
        w = load_file(os.path.join(folder, "model.safetensors"))
        act = c.get("activation_function") or "torch.nn.modules.activation.Tanh"
        steps.append(("dense", (w["linear.weight"], w.get("linear.bias"), act.endswith("Tanh"))))
    elif kind == "Normalize":
        steps.append(("normalize", None))
    else:
        raise SystemExit(f"module {m['type']} is not one this reference computes")


def embed(ids):
    with torch.no_grad():
        h = last_hidden(ids)
        x = None
        for step, arg in steps:
            if step == "pool":
                x = {"cls": h[0], "mean": h.mean(0), "lasttoken": h[-1]}[arg]
            elif step == "dense":
                w, b, tanh = arg
                x = x @ w.T + (b if b is not None else 0)
                x = torch.tanh(x) if tanh else x
            else:
                x = F.normalize(x, dim=-1)
        return F.normalize(x, dim=-1)


if pretrained:
    tok = AutoTokenizer.from_pretrained(d)
else:
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
bare = tok("a", add_special_tokens=False)["input_ids"]
framed = tok("a")["input_ids"]
at = next(i for i in range(len(framed)) if framed[i:i + len(bare)] == bare)
prefix, suffix = framed[:at], framed[at + len(bare):]
specials = set(prefix + suffix) | set(tok.all_special_ids)
ordinary = [i for i in range(vocab_size) if i not in specials]
# A tokenizer that cuts texts (all-MiniLM's says 256 tokens) must not: the chunks do that.
tok.model_max_length = 1 << 30

out = {"cases": [], "documents": [], "ids": []}
for n in [int(x) for x in os.environ.get("LENGTHS", "").split()]:
    body = [random.choice(ordinary) for _ in range(max(n - len(prefix) - len(suffix), 1))]
    ids = prefix + body + suffix
    out["cases"].append({"name": f"{os.environ.get('CASE_PREFIX', '')}len{len(ids)}", "ids": ids,
                         "embedding": embed(ids).tolist()})

st = {}
if os.path.exists(os.path.join(d, "config_sentence_transformers.json")):
    st = json.load(open(os.path.join(d, "config_sentence_transformers.json")))
prompts = st.get("prompts", {})
doc_prompt = next((prompts[k] for k in ("document", "passage", "corpus") if k in prompts), "")
max_tokens = int(os.environ.get("MAX_TOKENS", "0"))
texts = open(os.environ["TEXTS"]).read().splitlines() if os.environ.get("TEXTS") else []
prompt_ids = tok(doc_prompt, add_special_tokens=False)["input_ids"] if doc_prompt else []
for text in texts:
    out["ids"].append(tok(text)["input_ids"])
    # sentence-transformers >= 5.4 tokenises the prompt and the text as given (<= 5.3 stripped
    # them: TEXT_RULE=stripped).
    given = doc_prompt + text
    if os.environ.get("TEXT_RULE") == "stripped":
        given = given.strip()
    raw = tok(given, add_special_tokens=False)["input_ids"]
    room = max(max_tokens - len(prefix) - len(suffix), 1)
    chunks = [prefix + raw[:room] + suffix]
    later = max_tokens - len(prefix) - len(suffix) - len(prompt_ids)
    cont = prompt_ids if later >= 1 else []
    later = max(later if cont else room, 1)
    chunks += [prefix + cont + raw[i:i + later] + suffix for i in range(room, len(raw), later)]
    vectors = [embed(c) for c in chunks]
    mean = sum(len(c) * v.double() for c, v in zip(chunks, vectors))
    out["documents"].append({"chunks": len(chunks),
                             "embedding": F.normalize(mean, dim=-1).float().tolist()})

json.dump(out, open(os.environ["OUT"], "w"))
print(json.dumps({"cases": len(out["cases"]), "documents": len(out["documents"]),
                  "model": type(model).__name__}))
