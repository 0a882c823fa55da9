#!/usr/bin/env python3
"""transformers' side of benches/families-cpu.sh: makes MODEL_DIR (a tiny model of FAMILY that
`embedfleet make-tiny-model --family` wrote) a model at a real model's width, random, saved with
save_pretrained (its dense modules too, for EmbeddingGemma), then times transformers' forward of
BATCH sequences of LEN tokens on the CPU, f32, SDPA, THREADS threads: one warm-up forward, the
median of FORWARDS.

    families_cpu.py MODEL_DIR FAMILY LEN BATCH THREADS [FORWARDS] [LAYERS]

Widths (LAYERS layers each, default 4: the ratio is per layer):
  bert, xlm-roberta: BERT-base (768 hidden, 12 heads, 3,072 intermediate)
  modernbert: ModernBERT-base (768, 12 heads, 1,152 intermediate, 128-token local window)
  gemma3_text: EmbeddingGemma-300m (768, 3 heads of 256 over 1 key/value head, 1,152, 512 window)
  nomic_bert: nomic-embed-text-v1.5 (768, 12 heads, 3,072, no biases); transformers has no class
    for it, so the PyTorch side is benches/nomic_bert_torch.py (eager, SDPA)
"""
import json
import math
import os
import statistics
import sys
import time

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel

d, family, length, batch, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
forwards = int(sys.argv[6]) if len(sys.argv) > 6 else 3
layers = int(sys.argv[7]) if len(sys.argv) > 7 else 4
torch.set_num_threads(threads)
torch.manual_seed(0)

path = os.path.join(d, "config.json")
c = json.load(open(path))
if family == "nomic_bert":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nomic_bert_numpy import NomicBert
    from nomic_bert_torch import NomicBertTorch

    c.update({"n_embd": 768, "n_head": 12, "n_inner": 3072, "n_layer": layers, "n_positions": 8192,
              "vocab_size": 32768, "qkv_proj_bias": False, "mlp_fc1_bias": False,
              "mlp_fc2_bias": False})
    json.dump(c, open(path, "w"))
    sbert = os.path.join(d, "sentence_bert_config.json")
    json.dump({"max_seq_length": 8192}, open(sbert, "w"))
    NomicBert.random(c, 0).save(d)
    model = NomicBertTorch.load(d).eval()
    ids = torch.randint(300, c["vocab_size"], (batch, length))
    with torch.no_grad():
        model(ids)
        secs = []
        for _ in range(forwards):
            t = time.perf_counter()
            model(ids)
            secs.append(time.perf_counter() - t)
    print(f"| torch | {family} | {length} | {batch} | {length * batch / statistics.median(secs):.0f} |")
    sys.exit(0)
c.update({"hidden_size": 768, "num_hidden_layers": layers, "max_position_embeddings": 8192 + 2,
          "vocab_size": 32768})  # throughput does not depend on the vocabulary
if family in ("bert", "xlm-roberta"):
    c.update({"num_attention_heads": 12, "intermediate_size": 3072})
elif family == "modernbert":
    c.update({"num_attention_heads": 12, "intermediate_size": 1152, "local_attention": 128,
              "global_attn_every_n_layers": 3, "max_position_embeddings": 8192})
    c.pop("layer_types", None)
elif family == "gemma3_text":
    c.update({"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 256,
              "query_pre_attn_scalar": 256, "intermediate_size": 1152, "sliding_window": 512,
              "max_position_embeddings": 2048})
    c.pop("layer_types", None)
json.dump(c, open(path, "w"))
sbert = os.path.join(d, "sentence_bert_config.json")
if os.path.exists(sbert):
    json.dump({"max_seq_length": c["max_position_embeddings"]}, open(sbert, "w"))

config = AutoConfig.from_pretrained(d)
model = AutoModel.from_config(config, attn_implementation="sdpa").float().eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
        elif name.endswith("bias"):
            p.normal_(0.0, 0.1)
        else:
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
model.save_pretrained(d)
# EmbeddingGemma's dense modules at its width: 768 -> 3,072 -> 768.
for folder, (i, o) in (("2_Dense", (768, 3072)), ("3_Dense", (3072, 768))):
    f = os.path.join(d, folder)
    if os.path.isdir(f):
        save_file({"linear.weight": torch.randn(o, i) / math.sqrt(i)}, os.path.join(f, "model.safetensors"))
        json.dump({"in_features": i, "out_features": o, "bias": False,
                   "activation_function": "torch.nn.modules.linear.Identity"},
                  open(os.path.join(f, "config.json"), "w"))

ids = torch.randint(300, config.vocab_size, (batch, length))
with torch.no_grad():
    model(input_ids=ids)
    secs = []
    for _ in range(forwards):
        t = time.perf_counter()
        model(input_ids=ids)
        secs.append(time.perf_counter() - t)
print(f"| torch | {family} | {length} | {batch} | {length * batch / statistics.median(secs):.0f} |")
