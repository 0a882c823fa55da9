# The PyTorch peer of `embedfleet bench-gpu` (the project's copy of the team's
# shared/bench/torch_baseline.py; benches/gpu-check.sh runs both in one script).
# MIX_PAPERS (default 240) sets the size of the paper mix, MIX_OUT writes its token lengths
# (JSON) so `bench-gpu --mix` embeds the very same papers. To fit a short GPU session:
# UNIFORM_FORWARDS (default 4) forwards per uniform shape (two of them warm up first; timed: all
# of them), STUDY_PAPERS (default: all) runs the study's padded batches on the first N papers only.
# Anchor: HF transformers Qwen3 (Qwen3-Embedding-4B shape, random bf16 weights) on one GPU.
# Measures forward tokens/s for (a) uniform shapes, (b) a paper-like length mix batched
# the way the HPC study did (<=8 papers, <=150k chars, padded) versus length-sorted token budgets,
# and (c) the same mix one paper per forward with no padding. Prints one JSON line per run.
import json, time, math, random, sys, os
import torch
from transformers import Qwen3Config, Qwen3Model

def log(**kw):
    print(json.dumps(kw), flush=True)

cfg = Qwen3Config(vocab_size=151665, hidden_size=2560, intermediate_size=9728,
                  num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=40960, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
cfg._attn_implementation = "sdpa"
t0 = time.time()
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3Model(cfg).to(torch.bfloat16).eval()
torch.cuda.synchronize()
nparams = sum(p.numel() for p in model.parameters())
nonemb = nparams - cfg.vocab_size * cfg.hidden_size
log(event="loaded", secs=round(time.time() - t0, 1), params=nparams, non_embedding=nonemb,
    torch=torch.__version__, gpu=torch.cuda.get_device_name(0))

def flops(lengths):
    # 2*nonemb per token + causal attention (QK^T and PV): 2*2*layers*heads*hd*L^2/2 per seq
    f = 2 * nonemb * sum(lengths)
    for L in lengths:
        f += 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * L * L
    return f

@torch.inference_mode()
def run_batch(lengths, pad=True):
    B, T = len(lengths), max(lengths)
    ids = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    mask = torch.zeros((B, T), dtype=torch.long, device="cuda")
    for i, L in enumerate(lengths):
        mask[i, T - L:] = 1  # left padding, as Qwen3-Embedding uses
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    emb = torch.nn.functional.normalize(out[:, -1].float(), dim=-1)
    return emb

def timed(batches, label, iters=1):
    for b in batches[:2]:
        run_batch(b)
    torch.cuda.synchronize()
    t = time.time()
    real = padded = 0
    for _ in range(iters):
        for b in batches:
            run_batch(b)
            real += sum(b); padded += len(b) * max(b)
    torch.cuda.synchronize()
    dt = time.time() - t
    f = sum(flops(b) for b in batches) * iters
    log(event="bench", label=label, secs=round(dt, 3), real_tokens=real, padded_tokens=padded,
        real_tok_per_s=round(real / dt), tflops_useful=round(f / dt / 1e12, 1),
        peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1))

# (a) uniform shapes, 32k tokens per forward
UNIFORM_FORWARDS = int(os.environ.get("UNIFORM_FORWARDS", "4"))
for B, T in [(64, 512), (16, 2048), (4, 8192), (1, 32768)]:
    try:
        timed([[T] * B] * UNIFORM_FORWARDS, f"uniform_b{B}_t{T}")
    except Exception as e:
        log(event="error", label=f"uniform_b{B}_t{T}", err=str(e)[:300])
    torch.cuda.empty_cache()

# (b) paper-like mix: lognormal chars, ~4.2 chars/token, capped at 32k tokens
random.seed(0)
chars = [min(int(random.lognormvariate(math.log(20000), 0.8)), 130000)
         for _ in range(int(os.environ.get("MIX_PAPERS", "240")))]
toks = [max(16, min(32768, c * 10 // 42)) for c in chars]
if os.environ.get("MIX_OUT"):
    with open(os.environ["MIX_OUT"], "w") as f:
        json.dump(toks, f)
# study heuristic: consecutive papers, <=8 per batch, <=150k chars per batch (on the first
# STUDY_PAPERS papers when set)
study_n = int(os.environ.get("STUDY_PAPERS") or len(toks))
study, cur, cc = [], [], 0
for c, t in zip(chars[:study_n], toks[:study_n]):
    if cur and (len(cur) == 8 or cc + c > 150000):
        study.append(cur); cur, cc = [], 0
    cur.append(t); cc += c
if cur: study.append(cur)
# length-sorted, token budget 64k padded tokens per batch
srt, cur = [], []
for t in sorted(toks):
    if cur and (len(cur) + 1) * max(cur + [t]) > 65536:
        srt.append(cur); cur = []
    cur.append(t)
if cur: srt.append(cur)
log(event="mix", papers=len(toks), total_tokens=sum(toks), mean_tokens=sum(toks) // len(toks),
    study_papers=min(study_n, len(toks)), study_batches=len(study), sorted_batches=len(srt))
for label, bs in [("study_heuristic_padded", study), ("sorted_token_budget_64k", srt)]:
    try:
        timed(bs, label)
    except Exception as e:
        log(event="error", label=label, err=str(e)[:300])
    torch.cuda.empty_cache()

# (c) the best simple PyTorch approach on the same mix: one paper per forward, no padding,
# no mask, so sdpa takes its causal flash kernel.
@torch.inference_mode()
def one(L):
    ids = torch.randint(0, cfg.vocab_size, (1, L), device="cuda")
    h = model(input_ids=ids).last_hidden_state[:, -1]
    return torch.nn.functional.normalize(h.float(), dim=-1)

for L in toks[:3]:
    one(L)
torch.cuda.synchronize()
t = time.time()
for L in toks:
    one(L)
torch.cuda.synchronize()
dt = time.time() - t
log(event="bench", label="one_paper_per_forward_nopad", secs=round(dt, 3), real_tokens=sum(toks),
    padded_tokens=sum(toks), real_tok_per_s=round(sum(toks) / dt),
    tflops_useful=round(sum(flops([L]) for L in toks) / dt / 1e12, 1),
    peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1))
