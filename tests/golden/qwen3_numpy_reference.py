"""An independent reference for the Qwen3 forward: transformers' Qwen3 math written out in numpy
(float64 by default), on random weights with transformers' own init (normal, std 0.02; norms 1),
rounded to bf16 values so that a bf16 run loads exactly the same weights.

Writes OUT/{config.json, model.safetensors} (f32, transformers 5's config layout) and
OUT/fidelity.json (`bench-gpu --fidelity`'s cases: name, ids, embedding). Used by the e2e test
`bench_gpu_matches_a_float64_reference_on_the_4b_attention_layout` and by hand at larger shapes:

    python3 tests/golden/qwen3_numpy_reference.py OUT 16,512,2048 [LAYERS]
    env: HIDDEN=2560 INTER=9728 VOCAB=1000 REF_DTYPE=float64|float32 SEED=0
"""
import json, os, struct, sys

import numpy as np

out, lengths = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
H, I, V = (int(os.environ.get(k, d)) for k, d in (("HIDDEN", 2560), ("INTER", 9728), ("VOCAB", 1000)))
NH, NKV, HD, THETA, EPS = 32, 8, 128, 1e6, 1e-6  # the 4B/8B attention layout
rng = np.random.default_rng(int(os.environ.get("SEED", 0)))


def bf16_exact(a):
    """float32 values rounded to the nearest bf16 (ties to even), kept as float32."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


W = {"embed_tokens.weight": rng.normal(0, 0.02, (V, H))}
for l in range(layers):
    p = f"layers.{l}."
    for name, n in (("input_layernorm", H), ("post_attention_layernorm", H),
                    ("self_attn.q_norm", HD), ("self_attn.k_norm", HD)):
        W[p + name + ".weight"] = np.ones(n)
    for name, shape in (("self_attn.q_proj", (NH * HD, H)), ("self_attn.k_proj", (NKV * HD, H)),
                        ("self_attn.v_proj", (NKV * HD, H)), ("self_attn.o_proj", (H, NH * HD)),
                        ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))):
        W[p + name + ".weight"] = rng.normal(0, 0.02, shape)
W["norm.weight"] = np.ones(H)
W = {k: bf16_exact(v) for k, v in W.items()}

os.makedirs(out, exist_ok=True)
header, offset = {}, 0
for k, v in W.items():
    header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
    offset += v.nbytes
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for v in W.values():
        f.write(v.tobytes())
json.dump({"architectures": ["Qwen3Model"], "model_type": "qwen3", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": layers, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "max_position_embeddings": 40960,
           "vocab_size": V, "rms_norm_eps": EPS, "tie_word_embeddings": True, "hidden_act": "silu",
           "rope_parameters": {"rope_theta": THETA, "rope_type": "default"},
           "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
           "torch_dtype": "float32"}, open(os.path.join(out, "config.json"), "w"))

DT = np.dtype(os.environ.get("REF_DTYPE", "float64"))
W = {k: v.astype(DT) for k, v in W.items()}
inv_freq = 1.0 / THETA ** (np.arange(0, HD, 2) / HD)


def rms_norm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rotate_half(x):
    return np.concatenate([-x[..., HD // 2:], x[..., :HD // 2]], -1)


def embed(ids):
    n = len(ids)
    x = W["embed_tokens.weight"][ids]
    angle = np.arange(n)[:, None] * inv_freq[None]
    angle = np.concatenate([angle, angle], -1)
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(layers):
        p = f"layers.{l}."
        h = rms_norm(x, W[p + "input_layernorm.weight"])
        q = rms_norm((h @ W[p + "self_attn.q_proj.weight"].T).reshape(n, NH, HD), W[p + "self_attn.q_norm.weight"])
        k = rms_norm((h @ W[p + "self_attn.k_proj.weight"].T).reshape(n, NKV, HD), W[p + "self_attn.k_norm.weight"])
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(n, NKV, HD)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        o = np.empty((n, NH, HD), DT)
        for head in range(NH):
            kv = head // (NH // NKV)  # transformers' repeat_kv: consecutive query heads share one
            s = q[:, head] @ k[:, kv].T / np.sqrt(HD) + causal
            e = np.exp(s - s.max(-1, keepdims=True))
            o[:, head] = (e / e.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(n, NH * HD) @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"])
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    y = rms_norm(x[-1], W["norm.weight"]).astype(np.float64)
    return y / np.linalg.norm(y)


ids_rng = np.random.default_rng(1)
cases = []
for n in lengths:
    ids = ids_rng.integers(0, V, n)
    cases.append({"name": f"random_{n}", "ids": ids.tolist(), "embedding": embed(ids).tolist()})
json.dump({"reference": f"numpy {DT}: transformers' Qwen3 math, {layers} layers, hidden {H}",
           "cases": cases}, open(os.path.join(out, "fidelity.json"), "w"))
print(json.dumps({"cases": len(cases), "out": out}))
