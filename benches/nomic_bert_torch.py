"""NomicBERT as PyTorch runs it eagerly (SDPA attention, f32), for benches/families-cpu.sh: the
CPU peer of embedfleet's `nomic_bert` family where transformers has no class (nomic's own
remote code wants flash-attn on a GPU and the network to fetch it). The architecture is
benches/nomic_bert_numpy.py's (which the fidelity test checks ours against); this is its fast
form: one fused q/k/v product, SDPA, fc11 and fc12 as two products as nomic's code runs them.

    model = NomicBertTorch.load(directory); model(input_ids=ids)  # ids: [batch, tokens]
"""
import glob
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class NomicBertTorch(torch.nn.Module):
    def __init__(self, config, tensors):
        super().__init__()
        self.c = config
        self.t = {k: v.float() for k, v in tensors.items()}
        self.vocab_size = config["vocab_size"]
        d, base = config["n_embd"] // config["n_head"], float(config.get("rotary_emb_base", 10000))
        positions = torch.arange(config.get("n_positions", 2048), dtype=torch.float32)
        inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = positions[:, None] * inv_freq[None, :]
        self.cos, self.sin = angles.cos(), angles.sin()

    @classmethod
    def load(cls, directory):
        config = json.load(open(os.path.join(directory, "config.json")))
        tensors = {}
        for f in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
            tensors.update(load_file(f))
        return cls(config, tensors)

    def linear(self, x, name):
        return F.linear(x, self.t[f"{name}.weight"], self.t.get(f"{name}.bias"))

    def rotate(self, x):
        """x: [batch, heads, tokens, head_dim]."""
        n = x.shape[2]
        cos, sin = self.cos[:n], self.sin[:n]
        first, second = x.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    def forward(self, input_ids):
        ids = input_ids
        c, t = self.c, self.t
        heads, eps = c["n_head"], c.get("layer_norm_epsilon", 1e-12)
        b, n = ids.shape
        h = c["n_embd"]
        x = F.embedding(ids, t["embeddings.word_embeddings.weight"])
        if "embeddings.token_type_embeddings.weight" in t:
            x = x + t["embeddings.token_type_embeddings.weight"][0]
        x = F.layer_norm(x, (h,), t["emb_ln.weight"], t["emb_ln.bias"], eps)
        for layer in range(c["n_layer"]):
            p = f"encoder.layers.{layer}"
            qkv = self.linear(x, f"{p}.attn.Wqkv").view(b, n, 3, heads, h // heads)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            attended = F.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v)
            attended = attended.transpose(1, 2).reshape(b, n, h)
            x = F.layer_norm(x + self.linear(attended, f"{p}.attn.out_proj"), (h,),
                             t[f"{p}.norm1.weight"], t[f"{p}.norm1.bias"], eps)
            gated = self.linear(x, f"{p}.mlp.fc11") * F.silu(self.linear(x, f"{p}.mlp.fc12"))
            x = F.layer_norm(x + self.linear(gated, f"{p}.mlp.fc2"), (h,),
                             t[f"{p}.norm2.weight"], t[f"{p}.norm2.bias"], eps)
        return x
