"""The PyTorch peer of `bench` (models/examples/bench.rs): transformers' Qwen3Model with random
weights, f32, SDPA, on the CPU, the same shapes, its threads set as ours. benches/cpu-peer.sh
runs both, one after the other, and prints each ratio.

    python benches/cpu_peer.py tiny|0.6b LENS [THREADS] [SECONDS]

LENS is a comma list of tokens per sequence; each length is measured over batches of about
4,096 tokens (tiny) or 2,048 (0.6b), as `bench` packs them, for SECONDS (3) after a warm-up.
"""
import sys, time
import torch
from transformers import Qwen3Config, Qwen3Model

threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
torch.set_num_threads(threads)


def config(name):
    if name == "tiny":
        return Qwen3Config(hidden_size=128, num_hidden_layers=3, num_attention_heads=6,
                           num_key_value_heads=2, head_dim=32, intermediate_size=256,
                           rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=512,
                           max_position_embeddings=32768)
    return Qwen3Config(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=4096,
                       max_position_embeddings=32768)


name = sys.argv[1]
model = Qwen3Model(config(name)).eval()
model.config._attn_implementation = "sdpa"
budget = 4096 if name == "tiny" else 2048
for length in [int(x) for x in sys.argv[2].split(",")]:
    seqs = max(1, budget // length)
    ids = torch.randint(0, 500, (seqs, length))
    with torch.inference_mode():
        model(input_ids=ids)
        start, reps = time.perf_counter(), 0
        while True:
            model(input_ids=ids)
            reps += 1
            if time.perf_counter() - start > seconds:
                break
        per = (time.perf_counter() - start) / reps
    print(f"| torch | {name} | {length} | {seqs} | {seqs * length / per:.0f} | threads {torch.get_num_threads()} |")
