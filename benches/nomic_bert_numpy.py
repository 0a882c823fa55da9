"""NomicBERT (nomic-embed-text v1 and v1.5) in numpy, in float64: the reference of embedfleet's
`nomic_bert` family (models/src/nomic_bert/), written from the published architecture and apart
from that code. transformers has no class for it (the model card loads nomic's remote code,
`NomicBertModel`), so benches/reference_encoder.py uses this one for `model_type: nomic_bert`.

The architecture (nomic's "Nomic Embed" report and its `NomicBertModel`):
- embeddings: the word embedding plus token type 0's (no position table), then a LayerNorm
  (`emb_ln`);
- each layer post-norm, as BERT: `x = norm1(x + out_proj(attention(Wqkv(x))))`, then
  `x = norm2(x + fc2(fc11(x) * silu(fc12(x))))` (SwiGLU: fc11 the value, fc12 the gate);
- attention over every token (bidirectional), scaled by 1/sqrt(head_dim), q and k rotated by
  rotary embeddings over the whole head, non-interleaved (the two halves of a head are the pair
  rotated), `inv_freq = base^(-2i/d)`, positions from 0;
- biases on Wqkv and out_proj when `qkv_proj_bias`, on fc11 and fc12 when `mlp_fc1_bias`, on
  fc2 when `mlp_fc2_bias`; LayerNorms always have one.
"""
import glob
import os

import numpy as np
from safetensors.numpy import load_file, save_file


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def rotate(x, base):
    """x: [tokens, heads, head_dim], positions 0.. along the first axis."""
    tokens, _, dim = x.shape
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(tokens, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    first, second = x[..., : dim // 2], x[..., dim // 2:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


class NomicBert:
    def __init__(self, config, tensors):
        self.c = config
        self.t = {k: v.astype(np.float64) for k, v in tensors.items()}

    @staticmethod
    def names(c):
        """Every tensor's name and shape, as nomic's checkpoints name them."""
        h, i = c["n_embd"], c.get("n_inner") or 4 * c["n_embd"]
        out = [("embeddings.word_embeddings.weight", (c["vocab_size"], h)),
               ("emb_ln.weight", (h,)), ("emb_ln.bias", (h,))]
        if c.get("type_vocab_size", 2) > 0:
            out.append(("embeddings.token_type_embeddings.weight", (c.get("type_vocab_size", 2), h)))
        for layer in range(c["n_layer"]):
            p = f"encoder.layers.{layer}"
            for name, rows, cols, bias in [("attn.Wqkv", 3 * h, h, c.get("qkv_proj_bias", True)),
                                           ("attn.out_proj", h, h, c.get("qkv_proj_bias", True)),
                                           ("mlp.fc11", i, h, c.get("mlp_fc1_bias", True)),
                                           ("mlp.fc12", i, h, c.get("mlp_fc1_bias", True)),
                                           ("mlp.fc2", h, i, c.get("mlp_fc2_bias", True))]:
                out.append((f"{p}.{name}.weight", (rows, cols)))
                if bias:
                    out.append((f"{p}.{name}.bias", (rows,)))
            for norm in ("norm1", "norm2"):
                out += [(f"{p}.{norm}.weight", (h,)), (f"{p}.{norm}.bias", (h,))]
        return out

    @classmethod
    def random(cls, config, seed):
        """Every parameter random (norm weights near 1, biases small), so that a bias left out
        or a norm misplaced shows in the vectors."""
        rng = np.random.default_rng(seed)
        tensors = {}
        for name, shape in cls.names(config):
            if len(shape) == 2:
                scale = 1.0 if "word_embeddings" in name else 0.5 if "token_type" in name \
                    else 1.0 / np.sqrt(shape[1])
                value = rng.normal(0.0, scale, shape)
            elif name.endswith("bias"):
                value = rng.normal(0.0, 0.1, shape)
            else:
                value = 1.0 + 0.1 * rng.normal(0.0, 1.0, shape)
            tensors[name] = value.astype(np.float32)
        return cls(config, tensors)

    @classmethod
    def load(cls, config, directory):
        tensors = {}
        for f in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
            tensors.update(load_file(f))
        return cls(config, tensors)

    def save(self, directory):
        """Over the directory's weights: one model.safetensors, f32."""
        for f in glob.glob(os.path.join(directory, "model*.safetensors*")):
            os.remove(f)
        save_file({k: v.astype(np.float32) for k, v in self.t.items()},
                  os.path.join(directory, "model.safetensors"))

    def linear(self, x, name):
        y = x @ self.t[f"{name}.weight"].T
        bias = self.t.get(f"{name}.bias")
        return y + bias if bias is not None else y

    def __call__(self, ids):
        """The last hidden state of one sequence: [tokens, hidden], float64."""
        c, t = self.c, self.t
        h, heads = c["n_embd"], c["n_head"]
        eps, base = c.get("layer_norm_epsilon", 1e-12), float(c.get("rotary_emb_base", 10000))
        x = t["embeddings.word_embeddings.weight"][np.asarray(ids)]
        if "embeddings.token_type_embeddings.weight" in t:
            x = x + t["embeddings.token_type_embeddings.weight"][0]
        x = layer_norm(x, t["emb_ln.weight"], t["emb_ln.bias"], eps)
        n, d = len(ids), h // heads
        for layer in range(c["n_layer"]):
            p = f"encoder.layers.{layer}"
            qkv = self.linear(x, f"{p}.attn.Wqkv").reshape(n, 3, heads, d)
            q, k, v = rotate(qkv[:, 0], base), rotate(qkv[:, 1], base), qkv[:, 2]
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
            attended = np.einsum("hqk,khd->qhd", softmax(scores), v).reshape(n, h)
            x = layer_norm(x + self.linear(attended, f"{p}.attn.out_proj"),
                           t[f"{p}.norm1.weight"], t[f"{p}.norm1.bias"], eps)
            gate = self.linear(x, f"{p}.mlp.fc12")
            hidden = self.linear(x, f"{p}.mlp.fc11") * (gate / (1.0 + np.exp(-gate)))
            x = layer_norm(x + self.linear(hidden, f"{p}.mlp.fc2"),
                           t[f"{p}.norm2.weight"], t[f"{p}.norm2.bias"], eps)
        return x
